"""The gateways' GET APIs, answered from the simulator's truth (DESIGN.md §2): what the fetcher
calls when an event stayed parked too long or a sequence gap outlived its retry window."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from app.simulator.lifecycles import Emitted, Truth


def build(truth: Truth, events: list[Emitted]) -> web.Application:
    """``events`` is read on every request, so a test can add to it while the API runs."""

    def pg_events() -> list[dict[str, Any]]:
        return sorted((orjson.loads(e.body) for e in events if e.gateway == "pg"), key=lambda b: b["sequence"])

    async def card_payment(request: web.Request) -> web.Response:
        answer = truth.card.get(request.match_info["ref"])
        return web.json_response(answer) if answer else web.json_response({"error": "not found"}, status=404)

    async def pg_since(request: web.Request) -> web.Response:
        try:
            since = int(request.query["since_sequence"])
            limit = min(int(request.query.get("limit", "100")), 1000)
        except (KeyError, ValueError):
            return web.json_response({"error": "since_sequence must be an integer"}, status=400)
        page = [b for b in pg_events() if b["sequence"] > since][:limit]
        return web.json_response({"data": page, "has_more": len(page) == limit})

    async def pg_object(request: web.Request) -> web.Response:
        wanted = request.match_info["id"]
        latest = None
        for body in pg_events():
            if body["data"]["object"]["id"] == wanted:
                latest = body["data"]["object"]
        return web.json_response(latest) if latest else web.json_response({"error": "not found"}, status=404)

    async def pg_balance(request: web.Request) -> web.Response:
        return web.json_response({"available_minor": sum(truth.balances.values())})

    app = web.Application()
    app.router.add_get("/payments/{ref}", card_payment)
    app.router.add_get("/v1/pay/events", pg_since)
    app.router.add_get("/v1/pay/deposits/{id}", pg_object)
    app.router.add_get("/v1/pay/withdrawals/{id}", pg_object)
    app.router.add_get("/v1/pay/balance", pg_balance)
    return app
