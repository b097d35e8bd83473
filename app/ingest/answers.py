"""The ingest's JSON answers, its refusals (problem documents) and the 503 cause every I/O step raises (I/O shell)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from app.problem import CONTENT_TYPE as PROBLEM
from app.problem import problem_bytes


class Unavailable(Exception):
    """Kafka (or PostgreSQL) could not take the write in time: answer 503 so the sender retries."""


def json_response(code: int, **body: Any) -> web.Response:
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


def refusal(code: int, detail: str) -> web.Response:
    """A refusal as an RFC 9457 problem document (app/problem.py); the status is the contract's."""
    return web.Response(status=code, body=problem_bytes(code, detail), content_type=PROBLEM)
