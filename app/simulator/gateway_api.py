"""What a gateway simulator's GET API is given, and what every request served is counted in
(simulator layer). Each gateway's simulator module declares its routes (``GatewaySimulator.api``);
app/simulator/api.py serves them all on one application.

``fetch_api`` says how they answer:
- ``truth``: the gateway's final state (the card payment's GET answer, every pg event);
- ``404``: every request is answered 404, so nothing the fetcher asks for can help: what the read
  models hold then is the reducers' work alone;
- ``stale``: one event behind: a card payment as it stood before its last event, the pg events
  feed and objects without their newest event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from app.simulator.expected import Fetched
from app.simulator.lifecycles import Emitted, Truth

FETCH_APIS = ("truth", "404", "stale")


@dataclass
class Served:
    requests: Counter[tuple[str, int]] = field(default_factory=Counter)  # (route, status) -> requests
    card_answers: list[Fetched] = field(default_factory=list)  # every 200 of GET /payments/{ref}

    def count(self, route: str, status: int | None = None) -> int:
        return sum(n for (r, s), n in self.requests.items() if r == route and status in (None, s))


@dataclass
class ApiContext:
    """The simulator's truth and events (``events`` is read on every request, so a test can add to
    it while the API runs), how to answer, and the count of what was served."""

    truth: Truth
    events: list[Emitted]
    fetch_api: str
    served: Served

    @property
    def lag(self) -> int:
        """How many of its newest events an answer leaves out."""
        return 1 if self.fetch_api == "stale" else 0

    def answer(self, route: str, body: Any, status: int = 200) -> web.Response:
        self.served.requests[route, status] += 1
        return web.json_response(body, status=status)

    def not_found(self, route: str) -> web.Response:
        return self.answer(route, {"error": "not found"}, 404)


Routes = Callable[[ApiContext], list[web.RouteDef]]
