"""Seeded histories for `orderly simulate --check` (pure: no I/O, clock or global randomness).

A history is one gateway's small world: the lifecycle the gateway really went through (``events``,
in the gateway's own order, each with the facts the oracle reasons from) and what reached
Orderly's log (``deliveries``, in arrival order): first attempts, the gateway's retries on its own
schedule, lost 200s delivered again, outages that swallow attempts, deliveries given up after the
retry window, the merchant's pg correlations at any point, and the fetches the documents prescribe.

Fetches, as chosen for the oracle (DESIGN.md §2.1, §2.2):
- card: an event the gateway gave up on is followed, 60-90 s after its last attempt, by the
  gateway's GET /payments answer as a ``synced`` delivery (the fetcher asks once a parked event
  is older than 60 s; where nothing would park, it is the operator's fetch-now). Some histories
  also fetch at a random moment. An answer holds the truth of every event created before it.
- pg: an event given up on is lost; the gap it leaves is backfilled 4 days after it was first
  seen in most histories (the events API answers every event since the gap, so the others come
  again as duplicates), and stays open in the rest.
- paymos: no fetch API; outages are shorter than the retry window, so every event arrives.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

MIN, HOUR, DAY = 60_000, 3_600_000, 86_400_000
BACKFILL_AFTER_MS = 4 * DAY
FETCH_AFTER_MS = 60_000


@dataclass(frozen=True)
class Event:
    """One event the gateway created: its resource, its body and what it means (``fact``)."""

    resource: str
    body: bytes
    created_ms: int
    fact: dict[str, Any]


@dataclass(frozen=True)
class Delivery:
    """One record that reached orderly.raw: a webhook, a fetch's answer or a merchant's correlation."""

    source: str  # "webhook" | "fetch" | "correlation"
    resource: str
    body: bytes
    at_ms: int
    event: int = -1  # index in History.events (webhooks and backfills), else -1
    fact: dict[str, Any] = field(default_factory=dict)  # a fetch's answer, a correlation's mapping

    def describe(self) -> str:
        what = self.body.decode()
        return f"{self.at_ms:>14} {self.source:<11} {self.resource:<16} {what[:220]}"


@dataclass
class History:
    gateway: str
    seed: int
    events: list[Event]
    deliveries: list[Delivery]
    correlations: dict[str, dict[str, str]] = field(default_factory=dict)  # pg deposit -> mapping


@dataclass(frozen=True)
class Retrying:
    """How a gateway retries a webhook, from its documents (each gateway's simulator module holds its own)."""

    offsets: tuple[int, ...]  # of the attempts from the first one (pg: ~92 hours, DESIGN.md §2.1)
    longest_outage_ms: int = 5 * DAY  # the longest endpoint outage drawn (paymos: within its window)
    may_lose: bool = True  # the gateway may give up on an event whatever the endpoint answers


@dataclass
class Schedule:
    """The delivery conditions of one history: an endpoint outage and how flaky attempts are."""

    outage: tuple[int, int] | None
    fail: float
    duplicate: float
    lose: float = 0.0  # an event the gateway gives up on whatever the endpoint answers
    retrying: Retrying = Retrying((0,))

    @staticmethod
    def draw(rng: random.Random, start_ms: int, retrying: Retrying) -> Schedule:
        outage = None
        if rng.random() < 0.35:
            begin = start_ms + rng.randrange(0, 20 * MIN)
            length = rng.choice([MIN, 10 * MIN, HOUR, rng.randrange(MIN, retrying.longest_outage_ms)])
            outage = (begin, begin + length)
        lose = rng.choice([0.0, 0.0, 0.1, 0.3]) if retrying.may_lose else 0.0
        return Schedule(outage, rng.choice([0.0, 0.15, 0.4]), rng.choice([0.0, 0.08, 0.25]), lose, retrying)

    def down(self, at_ms: int) -> bool:
        return self.outage is not None and self.outage[0] <= at_ms < self.outage[1]


def attempts(rng: random.Random, event: Event, schedule: Schedule) -> tuple[list[int], int]:
    """When ``event`` reaches the log (several times if a 200 was lost), and when its last attempt
    was made; an empty list if every attempt in the retry window failed."""
    first = event.created_ms + rng.choice([0, 5, 40, 300, 1500])
    if rng.random() < schedule.lose:
        return [], first + schedule.retrying.offsets[-1]
    for offset in schedule.retrying.offsets:
        at = first + offset + (rng.randrange(0, 5_000) if offset else 0)
        if schedule.down(at) or rng.random() < schedule.fail:
            continue
        arrived = [at]
        while rng.random() < schedule.duplicate:  # the 200 was lost: the same event again
            arrived.append(arrived[-1] + rng.choice([1, 200, 30_000, 10 * MIN]))
        return arrived, at
    return [], first + schedule.retrying.offsets[-1]


def webhooks(rng: random.Random, events: list[Event],
             schedule: Schedule) -> tuple[list[Delivery], list[tuple[int, int]]]:
    """Every webhook delivery of ``events``, and (event index, last attempt ms) of those lost."""
    out, lost = [], []
    for index, event in enumerate(events):
        arrived, last = attempts(rng, event, schedule)
        if not arrived:
            lost.append((index, last))
        out += [Delivery("webhook", event.resource, event.body, at, index) for at in arrived]
    return out, lost


def in_arrival_order(rng: random.Random, deliveries: list[Delivery]) -> list[Delivery]:
    """Sorted by arrival; deliveries in the same millisecond in a random order (two pods)."""
    tie = {id(d): rng.random() for d in deliveries}
    return sorted(deliveries, key=lambda d: (d.at_ms, tie[id(d)]))

