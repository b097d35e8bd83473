"""The OpenAPI document (app/admin/openapi.py, DESIGN.md §3.1): valid OpenAPI 3.1; every route of the
ingest's and the admin's routers in it and nothing else; every operation with an operationId, a typed
success answer and, for the APIs, problem documents for its refusals; the effect delivery under
``webhooks`` matching what app/effects.py sends, and the checks the end-to-end tests run
(tests/openapi_check.py) failing on an answer or a delivery off the document.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from openapi_spec_validator import validate

from app.admin import shapes
from app.admin.app import create_app as create_admin
from app.admin.http import problem
from app.admin.openapi import document
from app.effects import request_body
from app.ingest.answers import refusal
from app.ingest.app import RECEIVER
from app.ingest.app import create_app as create_ingest
from app.problem import CONTENT_TYPE as PROBLEM
from app.problem import problem_bytes
from app.signing import signed_headers, signing_key
from app.webhook_http import response
from tests.openapi_check import answer_errors, checked, delivery_errors, operation_for, schema_errors
from tests.pipeline import EffectsStub
from tests.support import make_settings, serve_in_thread

SETTINGS = make_settings("127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "t0")
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
DOC = document()


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(DOC)  # raises on an invalid OpenAPI 3.1 document
    assert DOC["openapi"] == "3.1.0" and DOC["servers"] and DOC["webhooks"]


def routes(app: web.Application) -> set[tuple[str, str]]:
    """(method, path template) of every route, parameters unnamed, a static folder as its files."""
    found = set()
    for route in app.router.routes():
        resource = route.resource
        if resource is None or route.method == "HEAD":
            continue
        path = resource.canonical + ("/{}" if isinstance(resource, web.StaticResource) else "")
        found.add((route.method, re.sub(r"\{[^}]*\}", "{}", path)))
    return found


def documented(server: str) -> set[tuple[str, str]]:
    found = set()
    for path, item in DOC["paths"].items():
        on = {"admin" if s["url"] == "/" else "ingest" for s in item.get("servers", DOC["servers"])}
        if server in on:
            found |= {(method.upper(), re.sub(r"\{[^}]*\}", "{}", path)) for method in item if method != "servers"}
    return found


def test_every_route_of_the_admin_is_documented_and_nothing_else() -> None:
    assert routes(create_admin(SETTINGS)) == documented("admin")


def test_every_route_of_the_ingest_is_documented_and_nothing_else() -> None:
    async def build() -> web.Application:  # the ingest's clients want a running loop, none connects here
        return create_ingest(SETTINGS)

    assert routes(asyncio.run(build())) == documented("ingest")


def operations() -> list[tuple[str, str, dict[str, Any]]]:
    found = [(method, path, op) for path, item in DOC["paths"].items() for method, op in item.items()
             if method != "servers"]
    return found + [(method, f"webhooks.{name}", op) for name, item in DOC["webhooks"].items()
                    for method, op in item.items()]


def test_every_operation_has_a_unique_operation_id_and_a_typed_answer() -> None:
    ids = [op["operationId"] for _, _, op in operations()]
    assert len(ids) == len(set(ids)) == len(operations()) >= 40
    for method, path, op in operations():
        answers = {status: r for status, r in op["responses"].items() if status.startswith("2") or status == "303"}
        assert answers, (method, path)
        for status, answer in answers.items():
            for media, content in answer.get("content", {}).items():
                schema = content["schema"]
                assert "$ref" in schema or "oneOf" in schema or schema.get("type"), (method, path, status, media)
                if media == "application/json" and path != "/openapi.json":
                    assert "$ref" in schema or "oneOf" in schema, (method, path, status)  # a component's


def test_every_refusal_of_the_apis_is_a_problem_document() -> None:
    for method, path, op in operations():
        if "console" in op["tags"] or path.startswith("webhooks."):
            continue  # pages for people answer text; the merchant's answers are the merchant's
        refusals = {s: r for s, r in op["responses"].items() if s[0] in "45"}
        if op["operationId"] not in ("getHealth", "getAdminMetrics", "getReadiness"):
            assert refusals, (method, path)
        for status, answer in refusals.items():
            if op["operationId"] == "getReadiness":
                continue  # a probe: its 503 is the readiness report, what failed named
            assert answer["content"] == {"application/problem+json": {
                "schema": {"$ref": "#/components/schemas/Problem"}}}, (method, path, status)


@given(st.sampled_from([400, 401, 403, 404, 408, 409, 413, 415, 422, 429, 500, 503]), st.text(max_size=300))
def test_a_problem_document_has_the_fields_rfc_9457_names(status: int, detail: str) -> None:
    body = orjson.loads(problem_bytes(status, detail))
    assert schema_errors({"$ref": "#/components/schemas/Problem"}, body) == []
    assert (body["type"], body["status"], body["detail"], body["error"]) == ("about:blank", status, detail, detail)
    assert body["title"] and body["title"] != "Error"


def test_the_admin_refuses_with_a_problem_document() -> None:
    answer = problem(409, "not dead")
    assert answer.content_type == "application/problem+json" and answer.status == 409
    assert isinstance(answer.body, bytes)
    assert answer_errors("POST", "/api/effects/k/retry", 409, answer.content_type, answer.body) == []
    # the same refusal in the shape before RFC 9457 is off the document
    old = answer_errors("POST", "/api/effects/k/retry", 409, "application/json", b'{"error": "not dead"}')
    assert old and "content type" in old[0]


def test_an_answer_off_the_document_is_caught() -> None:
    me = {"person": "ada", "role": "admin", "via": "oidc", "source": "127.0.0.1"}
    assert answer_errors("GET", "/api/me", 200, "application/json", orjson.dumps(me)) == []
    assert answer_errors("GET", "/api/me", 200, "application/json", orjson.dumps({**me, "role": "root"}))
    assert answer_errors("GET", "/api/me", 200, "application/json", orjson.dumps({**me, "extra": 1}))
    assert answer_errors("GET", "/api/me", 200, "application/json", orjson.dumps({"person": "ada"}))
    assert "not documented" in answer_errors("GET", "/api/me", 418, "application/json", b"{}")[0]
    assert answer_errors("GET", "/api/me", 200, "text/html", b"<p>") != []
    # the most literal template wins: .../fetch is not a resource whose id ends in /fetch
    matched = operation_for("POST", "/api/resources/card/pay%2F1/fetch")
    assert matched is not None and matched[0] == "/api/resources/{gateway}/{resource_id}/fetch"
    assert operation_for("GET", "/nowhere") is None
    assert operation_for("POST", "/webhooks/pg", "ingest") is not None and operation_for("POST", "/webhooks/pg") is None


def delivery(**changes: Any) -> tuple[bytes, dict[str, str]]:
    """An effect delivery as app/effects.py makes one (its body and headers), with ``changes`` to the row."""
    row = {"dedupe_key": "deposit:dep_1:credit_user", "type": "credit_user", "gateway": "pg", "resource_id": "dep_1",
           "payload": orjson.dumps({"user_id": "u_1", "order_id": "o_1", "amount_minor": 1000}).decode(),
           "caused_by": "d_1", **changes}
    body = request_body(row)
    headers = {"Idempotency-Key": row["dedupe_key"], "Content-Type": "application/json",
               **signed_headers(signing_key(SECRET), row["dedupe_key"], int(time.time()), body)}
    return body, headers


def test_an_effect_delivery_as_the_effects_worker_sends_it_matches_the_webhooks_entry() -> None:
    assert delivery_errors(*delivery()) == []
    assert delivery_errors(*delivery(gateway="adyen", type="mark_order_paid")) == []


@pytest.mark.parametrize("change", [
    lambda body, headers: (orjson.dumps({**orjson.loads(body), "extra": 1}), headers),  # a field not documented
    lambda body, headers: (orjson.dumps({k: v for k, v in orjson.loads(body).items() if k != "caused_by"}), headers),
    lambda body, headers: (orjson.dumps({**orjson.loads(body), "payload": "x"}), headers),  # payload not an object
    lambda body, headers: (orjson.dumps({**orjson.loads(body), "gateway": "paypal"}), headers),
    lambda body, headers: (b"not json", headers),
    lambda body, headers: (body, {k: v for k, v in headers.items() if k != "Idempotency-Key"}),
    lambda body, headers: (body, {**headers, "webhook-signature": "sha256=abc"}),
    lambda body, headers: (body, {**headers, "webhook-timestamp": "soon"}),
    lambda body, headers: (body, {**headers, "Content-Type": "text/plain"}),
])
def test_a_delivery_off_the_webhooks_entry_is_caught(change: Any) -> None:
    assert delivery_errors(*change(*delivery())) != []


def test_the_component_schemas_are_the_shapes_in_json_schema_2020_12() -> None:
    schemas = DOC["components"]["schemas"]
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)  # raises on a keyword used the way 2020-12 does not
        # schemathesis 4.32 turns prefixItems (a tuple's schema) into a list under items, refused as
        # not a schema: the fuzzing of the admin API would stop there
        assert not any("prefixItems" in node for node in nodes(schema)), name
    assert {s.__name__ for s in shapes.ANSWERS} <= set(schemas)
    assert all(schemas[s.__name__]["additionalProperties"] is False for s in shapes.ANSWERS)


def test_the_ingest_refuses_with_problem_documents_on_both_paths() -> None:
    async def refused() -> tuple[int, bytes, web.Response]:
        app = create_ingest(SETTINGS)
        status, body = await app[RECEIVER].webhook("pg", b"{}", {})  # no signature
        return status, body, refusal(409, "a different mapping is already stored")

    status, body, conflict = asyncio.run(refused())
    assert status == 401 and orjson.loads(body)["detail"]
    assert answer_errors("POST", "/webhooks/pg", 401, PROBLEM, body, "ingest") == []
    assert b"\r\nContent-Type: application/problem+json\r\n" in response(401, body, False)  # the fast path
    assert b"\r\nContent-Type: application/json\r\n" in response(200, b"{}", False)
    assert conflict.content_type == PROBLEM and isinstance(conflict.body, bytes)
    assert answer_errors("PUT", "/correlations/pg/deposits/d", 409, PROBLEM, conflict.body, "ingest") == []


def nodes(schema: Any) -> list[dict[str, Any]]:
    """Every object in a schema, itself included."""
    if isinstance(schema, list):
        return [n for item in schema for n in nodes(item)]
    if not isinstance(schema, dict):
        return []
    return [schema, *(n for value in schema.values() for n in nodes(value))]


def test_the_client_middleware_fails_the_caller_on_an_answer_off_the_document() -> None:
    """What the end-to-end tests' clients do with every answer: a 200 from /api/me without ``source``
    fails the request that got it; a conforming one is read as usual; another host's is not checked."""
    async def me(request: web.Request) -> web.Response:
        body = {"person": "ada", "role": "admin", "via": "oidc"}
        if request.query.get("whole"):
            body["source"] = "127.0.0.1"
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/api/me", me)

    async def ask(url: str, base: str) -> list[str]:
        seen = []
        async with aiohttp.ClientSession(middlewares=(checked(base),)) as http:
            async with http.get(f"{url}/api/me?whole=1") as resp:
                seen.append((await resp.json())["source"])
            with pytest.raises(AssertionError, match="source"):
                await http.get(f"{url}/api/me")
        async with aiohttp.ClientSession(middlewares=(checked("http://elsewhere:1"),)) as http:
            async with http.get(f"{url}/api/me") as resp:
                seen.append(str(resp.status))
        return seen

    with serve_in_thread(app) as url:
        assert asyncio.run(ask(url, url)) == ["127.0.0.1", "200"]


def test_the_merchant_stub_refuses_a_validly_signed_delivery_off_the_document() -> None:
    stub = EffectsStub(secret=SECRET)
    body, headers = delivery()
    assert stub.verify(body, headers) is None
    extra = orjson.dumps({**orjson.loads(body), "amount": 1.5})  # a field the document does not have
    resigned = {**headers, **signed_headers(signing_key(SECRET), headers["webhook-id"], int(time.time()), extra)}
    why = stub.verify(extra, resigned)
    assert why is not None and "off the OpenAPI document" in why and "amount" in why
