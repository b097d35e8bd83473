"""The ingest's JSON answers and the 503 cause every I/O step raises (I/O shell)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web


class Unavailable(Exception):
    """Kafka (or PostgreSQL) could not take the write in time: answer 503 so the sender retries."""


def json_response(code: int, **body: Any) -> web.Response:
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")
