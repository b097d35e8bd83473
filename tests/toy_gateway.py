"""A fourth gateway that exists only in the tests: it plugs in with one `registry.register` line and
must pass the same contract as the real three (tests/unit/test_gateway_contract.py).

`toy` signs with `X-Toy-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>." + body>`, sends
`{"id": "evt_…", "thing": {"id": "thg_…", "version": 3, "status": "…"}}` and is decided with a
version guard: a snapshot applies iff its version is greater than the stored one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import orjson

from app.core.model import APPLIED, DUPLICATE, STALE, Decision, Delivery, decide, numbered
from app.gateways import schema
from app.gateways.base import Route, SignatureError, any_match, check_timestamp, hmac_sha256
from app.gateways.limits import IdText, Int64, Text
from app.gateways.registry import Gateway

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


class ToyReducer:
    def apply_event(self, state: dict[str, Any] | None, raw: bytes, d: Delivery
                    ) -> tuple[dict[str, Any], list[Decision]]:
        state = state or {"n": 0, "version": None, "thing": None, "seen": []}
        body = orjson.loads(raw)
        thing, common = body["thing"], {"event_id": body["id"], "event_type": "thing.updated", "payload": body}
        if body["id"] in state["seen"]:
            return numbered(state, [decide(d, DUPLICATE, **common)])
        state["seen"].append(body["id"])
        if state["version"] is not None and thing["version"] <= state["version"]:
            return numbered(state, [decide(d, STALE, **common)])
        state["version"], state["thing"] = thing["version"], thing
        return numbered(state, [decide(d, APPLIED, **common)])

    def snapshot(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"version": state["version"], "thing": state["thing"]}


TOY = Gateway(NAME, ToyAdapter(), ToyReducer())


def example(thing_id: str, version: int = 1, event_id: str | None = None) -> bytes:
    return orjson.dumps({"id": event_id or f"evt_{thing_id}_{version}",
                         "thing": {"id": thing_id, "version": version, "status": "open"}})
