"""The card gateway's GET /payments/{ref} for end-to-end tests: a scripted answer per payment, 503s
on demand, and a record of every request (when, and what it was answered)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support import serve_in_thread


@dataclass
class CardApi:
    payments: dict[str, dict[str, Any]] = field(default_factory=dict)  # ref -> the answer; absent: 404
    fail_first: dict[str, int] = field(default_factory=dict)  # 503s before the real answer, per payment
    failing: set[str] = field(default_factory=set)  # payments answered 503 until taken out of here
    calls: Counter[str] = field(default_factory=Counter)
    answers: dict[str, list[int]] = field(default_factory=dict)  # the status of each answer, per payment
    asked_at: dict[str, list[float]] = field(default_factory=dict)  # wall-clock seconds of each request
    url: str = ""


def answer(ref: str, state: str, authorised: int, captured: int, refunded: int) -> dict[str, Any]:
    return {"payment_ref": ref, "state": state, "authorised_minor": authorised, "captured_minor": captured,
            "refunded_minor": refunded, "currency": "EUR"}


@contextmanager
def serve_card_api() -> Iterator[CardApi]:
    api = CardApi()

    async def get_payment(request: web.Request) -> web.Response:
        ref = request.match_info["ref"]
        api.calls[ref] += 1
        api.asked_at.setdefault(ref, []).append(time.time())
        status = 503 if ref in api.failing or api.calls[ref] <= api.fail_first.get(ref, 0) \
            else 200 if ref in api.payments else 404
        api.answers.setdefault(ref, []).append(status)
        if status == 200:
            return web.json_response(api.payments[ref])
        return web.json_response({"error": "unavailable" if status == 503 else "not found"}, status=status)

    app = web.Application()
    app.router.add_get("/payments/{ref}", get_payment)
    with serve_in_thread(app) as url:
        api.url = url
        yield api
