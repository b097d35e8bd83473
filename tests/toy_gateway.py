"""A fourth gateway that exists only in the tests: it plugs in with one `registry.register` line and
must pass the same contract as the real three (tests/unit/test_gateway_contract.py). This module is
all of it: adapter, reducer, read-model table, and simulator (its registry line names this module
as its ``simulator``), so tests/unit/test_toy_gateway.py can show that the ingest, the worker's
dispatch, `simulate --check`, the console's queries and replay take it from that one line.

`toy` signs with `X-Toy-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>." + body>`, sends
`{"id": "evt_…", "thing": {"id": "thg_…", "version": 3, "status": "…"}}` and is decided with a
version guard: a snapshot applies iff its version is greater than the stored one.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import msgspec
import orjson

from app.core.model import APPLIED, DUPLICATE, STALE, Common, Decision, Delivery, Recent, decide, numbered
from app.core.reducer import Reducer
from app.gateways import schema
from app.gateways.base import Route, SignatureError, any_match, check_timestamp, hmac_sha256
from app.gateways.limits import IdText, Int64, Text
from app.gateways.registry import Gateway, Table
from app.simulator import histories
from app.simulator.oracle import Outcome
from app.simulator.plugins import GatewaySimulator

NAME = "toy"
HEADER = "X-Toy-Signature"


class Thing(schema.Body):
    id: IdText
    version: Int64
    status: Text


class Event(schema.Body):
    id: IdText
    thing: Thing


DECODER = msgspec.json.Decoder(Event)


class ToyAdapter:
    def signed_headers(self, raw: bytes, secret: str, now: float) -> dict[str, str]:
        t = int(now)
        return {HEADER: f"t={t},v1={hmac_sha256(secret.encode(), f'{t}.'.encode() + raw).hex()}"}

    def verify(self, raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...], now: float) -> None:
        t, _, offered = (headers.get(HEADER) or "").partition(",v1=")
        if not t.startswith("t=") or not offered:
            raise SignatureError(f"missing or malformed {HEADER}")
        check_timestamp(t[2:], now)
        try:
            signature = bytes.fromhex(offered)
        except ValueError:
            raise SignatureError("v1 is not hex") from None
        if not any_match([hmac_sha256(s.encode(), f"{t[2:]}.".encode() + raw) for s in secrets], [signature]):
            raise SignatureError(f"no {HEADER} matches")

    def route(self, raw: bytes) -> Route:
        event = schema.decode(DECODER, raw)  # limits (depth, 64-bit integers, NUL) and types, named by path
        if isinstance(event, schema.Refusal):
            return Route.quarantine(event.code, event.reason)
        return Route(f"{NAME}:{event.thing.id}", event.id, "thing.updated")


def read(raw: bytes, checked: bool) -> Event | Route:
    """The worker's one read of a body (the toy keeps no unknown fields: its typed event is all)."""
    event = schema.decode(DECODER, raw)
    if isinstance(event, schema.Refusal):
        return Route.quarantine(event.code, event.reason)
    return event


class State(msgspec.Struct, gc=False):
    n: int = 0
    version: int | None = None
    thing: Thing | None = None
    seen: list[str] = msgspec.field(default_factory=list)
    recent: Recent = msgspec.field(default_factory=list, name="_recent")


class Snapshot(msgspec.Struct):
    version: int | None
    thing: Thing | None


def apply_event(state: State | None, event: Event, d: Delivery) -> tuple[State, list[Decision]]:
    state = state or State()
    thing = event.thing
    common: Common = {"event_id": event.id, "event_type": "thing.updated",
              "payload": {"id": event.id, "thing": {"id": thing.id, "version": thing.version, "status": thing.status}}}
    if event.id in state.seen:
        return numbered(state, [decide(d, DUPLICATE, **common)])
    state.seen.append(event.id)
    if state.version is not None and thing.version <= state.version:
        return numbered(state, [decide(d, STALE, **common)])
    state.version, state.thing = thing.version, thing
    row = {"id": thing.id, "version": thing.version, "status": thing.status}
    return numbered(state, [decide(d, APPLIED, row=row, table=TABLE, **common)])


def load(stored: bytes) -> State:
    return msgspec.json.decode(stored, type=State)


def snapshot(state: State) -> bytes:
    return msgspec.json.encode(Snapshot(state.version, state.thing))


TABLE = "toy_things"
# The one registry line (registered by the tests that use it: registry.register(TOY)).
TOY = Gateway(NAME, ToyAdapter(), Reducer(read, apply_event, load, msgspec.json.encode, snapshot),
              tables=(Table(TABLE, "id, version, status", key="id", kind="thing"),),
              parked_because="a toy thing never waits", simulator=__name__)


def example(thing_id: str, version: int = 1, event_id: str | None = None) -> bytes:
    return orjson.dumps({"id": event_id or f"evt_{thing_id}_{version}",
                         "thing": {"id": thing_id, "version": version, "status": "open"}})


# --- its simulator (app/simulator/plugins.py) ------------------------------------------------------
T0_MS = 1_796_000_000_000


def generate(rng: random.Random, seed: int, stem: str) -> histories.History:
    """One thing's snapshots, each delivered zero, one or two times, in any order."""
    thing = f"thg_{stem}"
    events = [histories.Event(thing, example(thing, v, f"evt_{stem}_{v}"), T0_MS + v, {"version": v})
              for v in range(1, rng.randrange(2, 7))]
    deliveries = [histories.Delivery("webhook", thing, e.body, T0_MS + rng.randrange(0, 10_000), i)
                  for i, e in enumerate(events) for _ in range(rng.choice([0, 1, 1, 2]))]
    return histories.History(NAME, seed, events, histories.in_arrival_order(rng, deliveries))


def oracle(history: histories.History) -> Outcome:
    """The version guard: the thing's row is its newest snapshot delivered."""
    want = Outcome()
    delivered = [history.events[d.event] for d in history.deliveries if d.source == "webhook"]
    if delivered:
        newest = max(delivered, key=lambda e: e.fact["version"])
        want.rows[newest.resource] = {"version": newest.fact["version"], "status": "open"}
    return want


SIMULATOR = GatewaySimulator(generate, oracle, rows={TABLE: ("version", "status")})
