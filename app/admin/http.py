"""HTTP helpers the admin API and the console share: answers, redirects, form bodies, checked parameters (I/O shell)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from app.admin import queries
from app.admin.context import Admin
from app.gateways.limits import DELIVERY_ID_MAX, ID_MAX, id_error
from app.problem import CONTENT_TYPE, problem_bytes
from app.producer import KeyedProducer
from app.waits import within

BODY_DEADLINE_S = 10.0  # a form body that has not arrived by then: 408
ID = r".+"  # resource ids, delivery ids and dedupe keys may hold '/', ':' and braces


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=queries.dumps(body), status=status, content_type="application/json")


def problem(status: int, error: str) -> web.Response:
    """A refusal as an RFC 9457 problem document (app/problem.py), the status kept as it was."""
    return web.Response(body=problem_bytes(status, error), status=status, content_type=CONTENT_TYPE)


def redirect(location: str) -> web.Response:
    """303 See Other, returned (aiohttp deprecates returning its HTTP exceptions as responses)."""
    return web.Response(status=303, headers={"Location": location})


class Refused(Exception):
    """A request the API refuses with a reason (a bad parameter): answered ``problem(status, error)``."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status, self.error = status, error


async def form(request: web.Request) -> Any:
    """The request's form, arrived within BODY_DEADLINE_S (a body that trickles in gets 408)."""
    try:
        return await within(request.post(), BODY_DEADLINE_S)
    except TimeoutError:
        raise web.HTTPRequestTimeout(text="the request body did not arrive in time") from None


def safe_next(target: str | None) -> str:
    """Where to go after login or an action: a path of this site only (no open redirect, and no
    character a browser drops or a header refuses: "/\t/evil" is read as "//evil")."""
    if (not target or not target.startswith("/") or target.startswith("//") or "\\" in target
            or any(ord(c) < 0x21 or ord(c) == 0x7F for c in target) or len(target) > 2000):
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return "/"
    return target


def text_param(request: web.Request, name: str, most: int = 200) -> str | None:
    """A free-text query parameter: None when absent, refused when PostgreSQL's text cannot hold it."""
    value = request.query.get(name) or None
    if value is not None and ("\x00" in value or len(value) > most):
        raise Refused(400, f"{name} must be at most {most} characters without NUL")
    return value


def path_id(request: web.Request, name: str) -> str:
    """An id from the path, within the ingest's limits for ids (so a NUL or 6,000 characters get
    400 here, not a database error); a delivery id within the longest Orderly makes."""
    value = request.match_info[name]
    if error := id_error(name, value, DELIVERY_ID_MAX if name == "delivery_id" else ID_MAX):
        raise Refused(400, error)
    return value


async def kafka_producer(admin: Admin) -> KeyedProducer | web.Response:
    """The admin's producer, or the 503 to answer when Kafka is away (nothing was done then)."""
    try:
        return await admin.producer()
    except Exception as exc:  # Kafka away: nothing was done, say so
        return problem(503, f"Kafka is not reachable, nothing was done: {type(exc).__name__}")
