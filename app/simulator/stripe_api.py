"""Stripe's GET API as the simulator serves it (simulator layer): the two requests Orderly's fetcher
makes for a PaymentIntent (app/gateways/stripe.py ``fetch_paths``), answered in Stripe's shapes from
the simulated lifecycles' answers (app/simulator/stripe.py ``Lifecycle.answers``), kept in the
truth under ``by_gateway["stripe"]``: PaymentIntent id -> the API's answer after each event.

- ``GET /v1/payment_intents/{id}``: the PaymentIntent; ``expand[]=latest_charge`` replaces the
  charge's id with the charge (https://docs.stripe.com/api/expanding_objects);
- ``GET /v1/refunds?payment_intent={id}``: a list object ``{"object": "list", "data", "has_more",
  "url"}`` (https://docs.stripe.com/api/pagination) of the PaymentIntent's refunds.

An unknown PaymentIntent is a 404 with Stripe's error object (``resource_missing``). In ``stale``
mode the answers are those before the newest event.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from app.simulator.gateway_api import ApiContext
from app.simulator.lifecycles import Truth

GATEWAY = "stripe"
Answer = tuple[dict[str, Any], dict[str, Any] | None, list[dict[str, Any]]]  # PaymentIntent, its charge, refunds


def answers(truth: Truth) -> dict[str, list[Answer]]:
    """The stripe answers the truth holds (filled by the lifecycles: app/simulator/stripe_history.py)."""
    found: dict[str, list[Answer]] = truth.by_gateway.setdefault(GATEWAY, {})
    return found


def api(context: ApiContext) -> list[web.RouteDef]:
    def current(pi: str) -> Answer | None:
        known = answers(context.truth).get(pi, [])
        if context.fetch_api == "404" or len(known) <= context.lag:
            return None
        return known[-1 - context.lag]

    def missing(route: str, pi: str) -> web.Response:
        context.served.requests[route, 404] += 1
        return web.json_response({"error": {"type": "invalid_request_error", "code": "resource_missing",
                                            "message": f"No such payment_intent: '{pi}'"}}, status=404)

    async def payment_intent(request: web.Request) -> web.Response:
        route, pi = "stripe GET /v1/payment_intents/{id}", request.match_info["id"]
        found = current(pi)
        if found is None:
            return missing(route, pi)
        intent, charge, _ = found
        expanded = "latest_charge" in request.query.getall("expand[]", [])
        return context.answer(route, {**intent, "latest_charge": charge if expanded and charge else
                                      (charge["id"] if charge else None)})

    async def refunds(request: web.Request) -> web.Response:
        route, pi = "stripe GET /v1/refunds", request.query.get("payment_intent", "")
        found = current(pi)
        if found is None:
            return missing(route, pi)
        return context.answer(route, {"object": "list", "data": found[2], "has_more": False, "url": "/v1/refunds"})

    return [web.get("/v1/payment_intents/{id}", payment_intent), web.get("/v1/refunds", refunds)]
