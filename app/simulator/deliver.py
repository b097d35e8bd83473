"""Deliver emitted events the way a gateway does (I/O): signed, retried on a compressed schedule,
sometimes duplicated, sometimes failing on the first attempt, and through endpoint outages."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from app.gateways import registry
from app.simulator import plugins
from app.simulator.lifecycles import T0_MS, Emitted

# pg retries for ~92 hours (1 min 10 s, 6 min 10 s, …); compressed so a demo run takes seconds
RETRY_S = (0.3, 0.8, 1.5, 3.0, 5.0, 8.0)


def signed_headers(gateway: str, body: bytes, secret: str, now: float | None = None) -> dict[str, str]:
    """What the gateway sends with ``body``: its own signature headers (app/gateways/registry.py)."""
    found = registry.find(gateway)
    if found is None:
        raise ValueError(f"no gateway {gateway!r}")
    return found.adapter.signed_headers(body, secret, time.time() if now is None else now)


def signed_body(gateway: str, body: bytes, secret: str) -> bytes:
    """The body as sent: a gateway that signs inside its body (adyen: each item) signs it here."""
    found = registry.find(gateway)
    sign = getattr(found.adapter, "sign_request", None) if found is not None else None
    return body if sign is None else bytes(sign(body, secret))


def retry_after_s(gateway: str, attempt: int, chaos: Chaos) -> float | None:
    """Seconds before attempt ``attempt + 1`` of a failed attempt ``attempt``; None: given up."""
    declared = plugins.simulator(gateway)  # a gateway's own schedule, in its seconds (adyen's queue)
    own = declared.retry_s if declared is not None else None
    schedule = RETRY_S if own is None else tuple(s * chaos.time_scale for s in own)
    return schedule[attempt - 1] if attempt <= len(schedule) else None


@dataclass
class Chaos:
    first_attempt_fails: float = 0.15  # the endpoint "timed out": the gateway retries later
    duplicate: float = 0.05  # the 200 was lost: the same event is delivered again
    time_scale: float = 1 / 40  # gateway milliseconds → real milliseconds
    jitter_s: float = 0.5
    late: frozenset[bytes] = frozenset()  # bodies whose first delivery comes ``late_s`` after it was due
    late_s: float = 0.0


@dataclass
class Stats:
    attempts: Counter[str] = field(default_factory=Counter)
    accepted: Counter[str] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    given_up: Counter[str] = field(default_factory=Counter)
    delivered: set[bytes] = field(default_factory=set)  # the bodies accepted at least once
    given_up_on: list[Emitted] = field(default_factory=list)

    @property
    def lost(self) -> frozenset[bytes]:
        """The bodies the gateway gave up on that no other delivery of the same event brought."""
        return frozenset(e.body for e in self.given_up_on) - self.delivered


async def deliver(url: str, events: list[Emitted], secrets: dict[str, str], rng: random.Random,
                  chaos: Chaos | None = None, concurrency: int = 16) -> Stats:
    chaos = chaos or Chaos()
    stats = Stats()
    start = time.monotonic()
    order = itertools.count()
    queue: list[tuple[float, int, Emitted, int, bool]] = []  # (due, tie, event, attempt, simulate failure)
    for e in events:
        due = start + (e.created_ms - T0_MS) / 1000 * chaos.time_scale + rng.random() * chaos.jitter_s
        if e.body in chaos.late:
            due += chaos.late_s
        heapq.heappush(queue, (due, next(order), e, 1, rng.random() < chaos.first_attempt_fails))
        if rng.random() < chaos.duplicate:
            stats.duplicates[e.gateway] += 1
            heapq.heappush(queue, (due + rng.random() * 2, next(order), e, 1, False))
    lock = asyncio.Lock()

    async def worker(http: aiohttp.ClientSession) -> None:
        while True:
            async with lock:
                if not queue:
                    return
                due, _, e, attempt, fail = heapq.heappop(queue)
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            stats.attempts[e.gateway] += 1
            ok = False
            if not fail:
                try:
                    async with http.post(f"{url}/webhooks/{e.gateway}",
                                         data=signed_body(e.gateway, e.body, secrets[e.gateway]),
                                         headers=signed_headers(e.gateway, e.body, secrets[e.gateway])) as resp:
                        ok = resp.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
            if ok:
                stats.accepted[e.gateway] += 1
                stats.delivered.add(e.body)
            elif (after := retry_after_s(e.gateway, attempt, chaos)) is not None:
                stats.retries[e.gateway] += 1
                async with lock:
                    heapq.heappush(queue, (time.monotonic() + after, next(order), e, attempt + 1, False))
            else:
                stats.given_up[e.gateway] += 1
                stats.given_up_on.append(e)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    return stats
