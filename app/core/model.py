"""The records the pure core produces: deliveries in, decisions with effects and facts out.

Pure layer: no I/O, clock or randomness. Every value is JSON-serialisable so it can travel on a
topic as-is; money is integer minor units (or decimal strings for crypto).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypedDict, TypeVar

import msgspec

from topics.records import Decision as Decision  # the core's outputs, defined with the topics they travel on
from topics.records import Effect as Effect
from topics.records import Fact as Fact

# Outcomes of one delivery (DESIGN.md §3, the timeline).
APPLIED, STALE, DUPLICATE, PARKED, UNPARKED, QUARANTINED, SYNCED = (
    "applied", "stale", "duplicate", "parked", "unparked", "quarantined", "synced")


# A Struct: built in C (one per record), and written inside a parked event as the same JSON object
# the dict of release 0.2 was (the field order is the format).
class Delivery(msgspec.Struct, frozen=True, gc=False):
    """One record of orderly.raw (or orderly.correlations) as the worker consumed it."""

    delivery_id: str
    gateway: str
    resource_key: str
    received_at_ms: int
    seq: int  # position in the source partition: orders decisions about one resource
    source: str = "webhook"


class Common(TypedDict, total=False):
    """What every decision about one event carries of it (passed on as ``**common``)."""

    event_id: str
    event_type: str
    sequence: int | None
    payload: object  # the body as the gateway sent it, or the correlation's fields


def decide(delivery: Delivery, outcome: str, *, event_id: str | None = None, event_type: str | None = None,
           sequence: int | None = None, row: Mapping[str, object] | None = None, table: str | None = None,
           effects: list[Effect] | None = None, facts: list[Fact] | None = None, payload: object = None,
           error: str | None = None) -> Decision:
    """The decision about ``delivery`` (its ordinal is set by :func:`numbered`). Keywords, passed on
    by position: a dataclass's __init__ takes positions for less than keywords, on every decision."""
    gateway, _, resource_id = delivery.resource_key.partition(":")
    # What Decision.__init__ does, field by field in its order, without calling it: in 3.11 a class
    # with a Python __init__ is built through a generic slot, about 3 k instructions a decision.
    made: Decision = _new(Decision)
    made.delivery_id = delivery.delivery_id
    made.gateway = gateway
    made.resource_id = resource_id
    made.outcome = outcome
    made.received_at_ms = delivery.received_at_ms
    made.seq = delivery.seq
    made.event_id = event_id
    made.event_type = event_type
    made.sequence = sequence
    made.row = row
    made.table = table
    made.effects = [] if effects is None else effects
    made.facts = [] if facts is None else facts
    made.payload = payload
    made.error = error
    return made


_new = object.__new__


# What was decided for one recent delivery: (delivery id, outcome, ordinal, event id, event type);
# the state keeps, per recent delivery, (its delivery id, what was decided for it).
Made = tuple[str, str, int, str | None, str | None]
Recent = list[tuple[str, list[Made]]]


class Numbered(Protocol):
    """What every gateway's state has besides its own fields: the ordinal and the recent deliveries."""

    n: int
    recent: Recent


S = TypeVar("S", bound=Numbered)


def numbered(state: S, decisions: list[Decision]) -> tuple[S, list[Decision]]:
    """Give each decision the resource's next ordinal: the read model keeps a delivery's latest
    outcome (parked, then unparked) by comparing ordinals, whatever topic the trigger came from."""
    # The decisions were made by this same call and nobody holds them yet: numbered in place.
    if len(decisions) == 1:  # nearly always: without the loop's iterator
        state.n = decisions[0].seq = state.n + 1
        return state, decisions
    first = state.n
    state.n = first + len(decisions)
    for i, dec in enumerate(decisions):
        dec.seq = first + i + 1
    return state, decisions


# A worker can decide a delivery a second time: when its batch was decided and its state written
# but the offsets were not committed yet (a crash, a rebalance). The state then already holds the
# delivery, so the reducer would call it a duplicate and the timeline would lose its real outcome.
# The state therefore remembers the last RECENT deliveries and what was decided for each; deciding
# one of them again re-emits those decisions (same outcome, same ordinal, no effects: they were
# acknowledged before the state was written).
RECENT = 8
RECENT_KEY = "_recent"  # its name in the state's JSON


def redecided(state: Numbered | None, d: Delivery) -> list[Decision] | None:
    """The decisions already made for delivery ``d``, or None if it is not among the recent ones."""
    if state is None:
        return None
    for trigger, made in state.recent:
        if trigger == d.delivery_id:
            gateway, _, resource_id = d.resource_key.partition(":")
            return [Decision(delivery_id, gateway, resource_id, outcome, d.received_at_ms, seq,
                             event_id=event_id, event_type=event_type)
                    for delivery_id, outcome, seq, event_id, event_type in made]
    return None


def remember(before: Recent, after: Numbered, d: Delivery, decisions: list[Decision]) -> None:
    """Record in ``after`` what was decided for ``d`` (keeping ``before``'s recent history)."""
    if after.recent is before:  # nearly always: the reducer kept its state's list, which nothing else holds
        recent = before
        if len(recent) >= RECENT:
            del recent[:len(recent) + 1 - RECENT]
    else:
        recent = before[1 - RECENT:]  # a copy: ``before`` may be another state's own list
        after.recent = recent
    if len(decisions) == 1:  # nearly always: without a comprehension's frame
        x = decisions[0]
        recent.append((d.delivery_id, [(x.delivery_id, x.outcome, x.seq, x.event_id, x.event_type)]))
    else:
        recent.append((d.delivery_id, [(x.delivery_id, x.outcome, x.seq, x.event_id, x.event_type) for x in decisions]))
