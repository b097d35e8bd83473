"""Answers and effect deliveries checked against the OpenAPI document (app/admin/openapi.py).

``answer_errors`` says how one HTTP answer differs from what the document gives its operation
(an undocumented status, another media type, a JSON body its schema refuses); ``delivery_errors``
how one effect delivery differs from the document's ``webhooks`` entry (a header missing or
malformed, a body its schema refuses). ``checked(base)`` is an aiohttp client middleware that fails
the request's caller with those differences, for every answer from ``base`` matching a documented
operation: the end-to-end tests' clients use it, and the merchant stub (tests/pipeline.py) refuses
a delivery that is off the document.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from functools import cache
from typing import Any

import aiohttp
import orjson
from jsonschema import Draft202012Validator, FormatChecker  # type: ignore[import-untyped]

from app.admin.openapi import document

Json = dict[str, Any]
JSON_MEDIA = re.compile(r"^application/([\w.+-]+\+)?json$")


@cache
def spec() -> Json:
    return document()


def schema_errors(schema: Json, value: Any) -> list[str]:
    """Why ``value`` is not an instance of ``schema`` (whose $refs point into the document's components)."""
    validator = Draft202012Validator({**schema, "components": spec()["components"]}, format_checker=FormatChecker())
    return [f"{'/'.join(map(str, e.absolute_path)) or '(body)'}: {e.message[:300]}"
            for e in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))]


def _pattern(template: str) -> re.Pattern[str]:
    # a parameter may hold '/' (resource ids, delivery ids, dedupe keys: the router's ``.+``)
    return re.compile("^" + re.sub(r"\\\{\w+\\\}", ".+", re.escape(template)) + "$")


def operation_for(method: str, path: str, servers: str = "admin") -> tuple[str, Json] | None:
    """The documented operation serving ``method path`` (the most literal template wins), or None.
    ``servers``: "admin" for the admin port's paths, "ingest" for the webhook port's."""
    found = []
    for template, item in spec()["paths"].items():
        on = {("ingest" if s["url"] != "/" else "admin") for s in item.get("servers", [{"url": "/"}])}
        op = item.get(method.lower())
        if servers in on and op is not None and _pattern(template).match(path):
            found.append((len(re.sub(r"\{\w+\}", "", template)), template, op))
    if not found:
        return None
    _, template, op = max(found, key=lambda f: f[0])
    return template, op


def answer_errors(method: str, path: str, status: int, content_type: str, body: bytes,
                  servers: str = "admin") -> list[str]:
    """How this answer differs from the document ([] when it conforms; also [] for a path the
    document has no operation for)."""
    matched = operation_for(method, path, servers)
    if matched is None:
        return []
    template, op = matched
    where = f"{method} {template} -> {status}"
    responses = op["responses"]
    response = responses.get(str(status)) or responses.get(f"{status // 100}XX") or responses.get("default")
    if response is None:
        return [f"{where}: status not documented (documented: {sorted(responses)})"]
    content = response.get("content")
    if not content:
        return [] if not body or status == 303 else [f"{where}: a body where the document gives none"]
    media = content.get(content_type) or next((m for k, m in content.items() if k.split(";")[0] == content_type), None)
    if media is None:
        return [f"{where}: content type {content_type!r}, documented {sorted(content)}"]
    if not JSON_MEDIA.match(content_type):
        return []
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return [f"{where}: not JSON: {exc}"]
    return [f"{where}: {e}" for e in schema_errors(media["schema"], value)]


def delivery_errors(body: bytes, headers: Mapping[str, str]) -> list[str]:
    """How one effect delivery differs from the document's ``webhooks.effect`` ([] when it conforms)."""
    op = spec()["webhooks"]["effect"]["post"]
    lowered = {k.lower(): v for k, v in headers.items()}
    errors = []
    for parameter in op["parameters"]:
        value = lowered.get(parameter["name"].lower())
        if value is None:
            errors.append(f"header {parameter['name']} missing")
            continue
        errors += [f"header {parameter['name']}: {e}" for e in schema_errors(parameter["schema"], value)]
    media = op["requestBody"]["content"]
    if lowered.get("content-type") not in media:
        errors.append(f"Content-Type {lowered.get('content-type')!r}, documented {sorted(media)}")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return [*errors, f"body: not JSON: {exc}"]
    schema = media["application/json"]["schema"]
    return errors + [f"body: {e}" for e in schema_errors(schema, value)]


Handler = Callable[[aiohttp.ClientRequest], Awaitable[aiohttp.ClientResponse]]
Middleware = Callable[[aiohttp.ClientRequest, Handler], Awaitable[aiohttp.ClientResponse]]


def checked(base: str, servers: str = "admin") -> Middleware:
    """An aiohttp client middleware: every answer from ``base`` is checked against the document,
    and one that is off it raises AssertionError in the test that asked."""

    async def check(request: aiohttp.ClientRequest, handler: Handler) -> aiohttp.ClientResponse:
        response = await handler(request)
        url = str(request.url)
        if url.startswith(base) and request.method != "HEAD":
            body = await response.read()  # kept: the caller's read() and json() read it again
            errors = answer_errors(request.method, request.url.raw_path, response.status, response.content_type,
                                   body, servers)
            assert not errors, f"an answer off the OpenAPI document: {errors[:5]}\nbody: {body[:500]!r}"
        return response

    return check
