"""The building blocks of the OpenAPI document: typed answers, problem answers, parameters (schema layer).

Answers refer to component schemas generated from app/admin/shapes.py; every refusal is an
RFC 9457 problem document (``application/problem+json``, app/problem.py).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import msgspec

from app.admin import shapes
from app.problem import CONTENT_TYPE as PROBLEM

Json = dict[str, Any]
REF = "#/components/schemas/{name}"


def ref(shape: type[msgspec.Struct]) -> Json:
    return {"$ref": REF.format(name=shape.__name__)}


def component_schemas() -> dict[str, Json]:
    """Every answer's schema by its Struct's name (and the Structs they hold)."""
    _, components = msgspec.json.schema_components(shapes.ANSWERS, ref_template=REF)
    return components


def ok(description: str, shape: type[msgspec.Struct] | Json, status: int = 200) -> Json:
    """A success answer with a JSON body of ``shape`` (a Struct, or a schema such as a ``oneOf``)."""
    schema = ref(shape) if isinstance(shape, type) else shape
    return {str(status): {"description": description, "content": {"application/json": {"schema": schema}}}}


def text(status: int, description: str, media: str = "text/plain", schema: Json | None = None) -> Json:
    """An answer that is not JSON: a page, a redirect, Prometheus text."""
    answer: Json = {"description": description}
    if status != 303:
        answer["content"] = {media: {"schema": schema or {"type": "string"}}}
    else:
        answer["headers"] = {"Location": {"description": "where to go next", "schema": {"type": "string"}}}
    return {str(status): answer}


def problems(*statuses: int, why: dict[int, str] | None = None) -> Json:
    """Refusals, each a problem document; ``why`` says when a status is answered."""
    return {str(status): {"description": (why or {}).get(status, HTTPStatus(status).phrase),
                          "content": {PROBLEM: {"schema": ref(shapes.Problem)}}} for status in statuses}


# The guard's refusals on every authenticated admin route (DESIGN.md §3.1): no or a wrong credential;
# a role too low (or a POST from a session without its CSRF token); too many wrong tokens from one
# address; PostgreSQL away.
GUARDED = problems(401, 403, 429, 500, 503, why={
    401: "no credential, or a wrong one", 403: "a role too low, or a session's POST without its CSRF token",
    429: "too many wrong tokens from this address; a right one is never refused",
    500: "a failure of the admin's own: its log has the traceback",
    503: "PostgreSQL is not reachable"})


def path_param(name: str, description: str, enum: list[str] | None = None) -> Json:
    schema: Json = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[^/{}?#%]+$"}
    if enum:
        schema = {"type": "string", "enum": enum}
    return {"name": name, "in": "path", "required": True, "description": description, "schema": schema}


def query(name: str, description: str, schema: Json) -> Json:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def header(name: str, description: str, schema: Json | None = None) -> Json:
    return {"name": name, "in": "header", "required": True, "description": description,
            "schema": schema or {"type": "string"}}


LIMIT = query("limit", "rows at most", {"type": "integer", "minimum": 1, "maximum": 500})


def operation(operation_id: str, summary: str, responses: Json, *, tags: list[str],
              parameters: list[Json] | None = None, body: Json | None = None,
              security: list[Json] | None = None) -> Json:
    op: Json = {"operationId": operation_id, "summary": summary, "tags": tags, "responses": responses}
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = body
    if security is not None:
        op["security"] = security
    return op


def json_body(shape: type[msgspec.Struct], description: str) -> Json:
    return {"required": True, "description": description, "content": {"application/json": {"schema": ref(shape)}}}
