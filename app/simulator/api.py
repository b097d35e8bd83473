"""The gateways' GET APIs, answered from the simulator's truth (DESIGN.md §2): what the fetcher
calls when an event stayed parked too long or a sequence gap outlived its retry window.

``fetch_api`` says how they answer:
- ``truth``: the gateway's final state (the card payment's GET answer, every pg event);
- ``404``: every request is answered 404, so nothing the fetcher asks for can help: what the read
  models hold then is the reducers' work alone;
- ``stale``: one event behind: a card payment as it stood before its last event, the pg events
  feed and objects without their newest event.
Every request is counted in the app's ``Served`` (``app[SERVED]``), with each card answer given.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from app.simulator.expected import Fetched, card_reduce
from app.simulator.lifecycles import Emitted, Truth

FETCH_APIS = ("truth", "404", "stale")


@dataclass
class Served:
    requests: Counter[tuple[str, int]] = field(default_factory=Counter)  # (route, status) -> requests
    card_answers: list[Fetched] = field(default_factory=list)  # every 200 of GET /payments/{ref}

    def count(self, route: str, status: int | None = None) -> int:
        return sum(n for (r, s), n in self.requests.items() if r == route and status in (None, s))


SERVED = web.AppKey("served", Served)


def stale_card_answer(ref: str, events: list[Emitted]) -> dict[str, Any] | None:
    """The payment as it stood before its last event (None if that leaves nothing to tell)."""
    bodies = [orjson.loads(e.body) for e in events if e.gateway == "card" and e.resource == ref]
    if len(bodies) < 2:
        return None
    before = card_reduce(bodies[:-1])
    return {"payment_ref": ref, "state": before["state"], "authorised_minor": before["authorised_minor"],
            "captured_minor": before["captured_minor"], "refunded_minor": before["refunded_minor"],
            "currency": bodies[-1]["currency"]}


def build(truth: Truth, events: list[Emitted], fetch_api: str = "truth") -> web.Application:
    """``events`` is read on every request, so a test can add to it while the API runs."""
    if fetch_api not in FETCH_APIS:
        raise ValueError(f"fetch_api must be one of {', '.join(FETCH_APIS)}, not {fetch_api!r}")
    served = Served()
    lag = 1 if fetch_api == "stale" else 0

    def answer(route: str, body: Any, status: int = 200) -> web.Response:
        served.requests[route, status] += 1
        return web.json_response(body, status=status)

    def not_found(route: str) -> web.Response:
        return answer(route, {"error": "not found"}, 404)

    def pg_events() -> list[dict[str, Any]]:
        ordered = sorted((orjson.loads(e.body) for e in events if e.gateway == "pg"), key=lambda b: b["sequence"])
        return ordered[:len(ordered) - lag]

    async def card_payment(request: web.Request) -> web.Response:
        route, ref = "card GET /payments/{ref}", request.match_info["ref"]
        if fetch_api == "404":
            return not_found(route)
        body = truth.card.get(ref) if fetch_api == "truth" else stale_card_answer(ref, events)
        if not body:
            return not_found(route)
        served.card_answers.append(Fetched(ref, dict(body), int(time.time() * 1000)))
        return answer(route, body)

    async def pg_since(request: web.Request) -> web.Response:
        route = "pg GET /v1/pay/events"
        if fetch_api == "404":
            return not_found(route)
        try:
            since = int(request.query["since_sequence"])
            limit = min(int(request.query.get("limit", "100")), 1000)
        except (KeyError, ValueError):
            return answer(route, {"error": "since_sequence must be an integer"}, 400)
        page = [b for b in pg_events() if b["sequence"] > since][:limit]
        return answer(route, {"data": page, "has_more": len(page) == limit})

    async def pg_object(request: web.Request) -> web.Response:
        route, wanted = "pg GET /v1/pay/{kind}/{id}", request.match_info["id"]
        if fetch_api == "404":
            return not_found(route)
        latest = None
        for body in pg_events():
            if body["data"]["object"]["id"] == wanted:
                latest = body["data"]["object"]
        return answer(route, latest) if latest else not_found(route)

    async def pg_balance(request: web.Request) -> web.Response:
        route = "pg GET /v1/pay/balance"
        if fetch_api == "404":
            return not_found(route)
        return answer(route, {"available_minor": sum(truth.balances.values())})

    app = web.Application()
    app[SERVED] = served
    app.router.add_get("/payments/{ref}", card_payment)
    app.router.add_get("/v1/pay/events", pg_since)
    app.router.add_get("/v1/pay/deposits/{id}", pg_object)
    app.router.add_get("/v1/pay/withdrawals/{id}", pg_object)
    app.router.add_get("/v1/pay/balance", pg_balance)
    return app
