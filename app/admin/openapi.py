"""The OpenAPI 3.1 document of the ingest's HTTP contract and the admin API (DESIGN.md §3, §3.1),
served at the admin's ``GET /openapi.json``. A test checks it against the OpenAPI 3.1 schema,
that every admin route is in it, and fuzzes the running admin API from it (schemathesis).
"""

from __future__ import annotations

from typing import Any

from app.admin import bulk
from app.gateways import registry


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("orderly")
    except PackageNotFoundError:
        return "unknown"


VERSION = _version()


def _error() -> dict[str, Any]:
    return {"description": "refused, with the reason",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _json(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": schema or {"type": "object"}}}}


def _path_param(name: str, description: str, enum: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[^/{}?#%]+$"}
    if enum:
        schema = {"type": "string", "enum": enum}
    return {"name": name, "in": "path", "required": True, "description": description, "schema": schema}


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


LIMIT = _query("limit", "rows at most", {"type": "integer", "minimum": 1, "maximum": 500})
ITEMS = {"type": "object", "required": ["items"],
         "properties": {"items": {"type": "array", "items": {"type": "object"}}}}
ADMIN_AUTH: list[dict[str, list[str]]] = [{"bearer": []}, {"session": []}]


def admin_paths() -> dict[str, Any]:
    gateways = list(registry.GATEWAYS)
    gateway = _path_param("gateway", "the gateway", gateways)
    resource = _path_param("resource_id", "the gateway's id of the resource")
    unauthorized = {"401": _error(), "403": _error()}  # no credential; a role too low (DESIGN.md §3.1)
    return {
        "/api/overview": {"get": {
            "summary": "counts now: deliveries by outcome, parked, gaps, quarantine, effects, consumer lag",
            "responses": {"200": _json("the counts", {"$ref": "#/components/schemas/Overview"}), **unauthorized}}},
        "/api/resources": {"get": {
            "summary": "search resources, newest delivery first, cursor-paginated",
            "parameters": [_query("gateway", "only this gateway", {"type": "string", "enum": gateways}),
                           _query("status", "the resource's status (e.g. paid, captured), or `parked`",
                                  {"type": "string", "maxLength": 100}),
                           _query("q", "part of the resource id, or an exact gateway event id",
                                  {"type": "string", "maxLength": 200}),
                           LIMIT, _query("cursor", "next_cursor of the previous page", {"type": "string"})],
            "responses": {"200": _json("a page", {"type": "object", "required": ["items", "next_cursor"],
                                                  "properties": {"items": {"type": "array"},
                                                                 "next_cursor": {"type": ["string", "null"]}}}),
                          "400": _error(), **unauthorized}}},
        "/api/resources/{gateway}/{resource_id}": {"get": {
            "summary": "current state, the decision timeline and the effects emitted",
            "parameters": [gateway, resource,
                           _query("order", "the timeline in arrival (default) or gateway order; each delivery "
                                  "has both positions and `late` either way", {"type": "string",
                                                                               "enum": ["arrival", "gateway"]})],
            "responses": {"200": _json("the resource", {"$ref": "#/components/schemas/Resource"}),
                          "404": _error(), **unauthorized}}},
        "/api/resources/{gateway}/{resource_id}/fetch": {"post": {
            "summary": "ask the gateway for the resource now (card payment; pg backfill of open gaps)",
            "parameters": [gateway, resource],
            "responses": {"200": _json("requested", {"$ref": "#/components/schemas/Done"}), "409": _error(),
                          "422": _error(), "503": _error(), **unauthorized}}},
        "/api/parked": {"get": {
            "summary": "resources holding parked deliveries, oldest first, with why, and `overdue` once parked "
                       "longer than ORDERLY_PARKED_ALERT_AFTER_S",
            "parameters": [LIMIT], "responses": {"200": _json("parked resources", ITEMS), **unauthorized}}},
        "/api/gaps": {"get": {
            "summary": "open pg sequence gaps with age and backfill status",
            "parameters": [LIMIT], "responses": {"200": _json("open gaps", ITEMS), **unauthorized}}},
        "/api/quarantine": {"get": {
            "summary": "records set aside by any stage, newest first",
            "parameters": [_query("stage", "ingest, worker, projector, effects or fetcher",
                                  {"type": "string", "maxLength": 20}),
                           _query("gateway", "only this gateway", {"type": "string", "enum": gateways}), LIMIT],
            "responses": {"200": _json("set-aside records", ITEMS), "400": _error(), **unauthorized}}},
        "/api/quarantine/{delivery_id}": {"get": {
            "summary": "one set-aside record with its headers and body",
            "parameters": [_path_param("delivery_id", "the record's delivery id")],
            "responses": {"200": _json("the record"), "404": _error(), **unauthorized}}},
        "/api/quarantine/{delivery_id}/redrive": {"post": {
            "summary": "append the stored body again where it was set aside from",
            "parameters": [_path_param("delivery_id", "the record's delivery id")],
            "responses": {"200": _json("appended", {"$ref": "#/components/schemas/Done"}), "404": _error(),
                          "409": _error(), "503": _error(), **unauthorized}}},
        "/api/effects": {"get": {
            "summary": "effects by delivery state, newest first, with attempts and last error",
            "parameters": [_query("state", "dead (default), pending or delivered",
                                  {"type": "string", "enum": ["pending", "dead", "delivered"]}), LIMIT],
            "responses": {"200": _json("effects", ITEMS), "400": _error(), **unauthorized}}},
        "/api/effects/{dedupe_key}/retry": {"post": {
            "summary": "a dead effect back to pending",
            "parameters": [_path_param("dedupe_key", "the effect's dedupe key")],
            "responses": {"200": _json("pending again", {"$ref": "#/components/schemas/Done"}), "404": _error(),
                          "409": _error(), **unauthorized}}},
        **identity_paths(unauthorized),
        **bulk_paths(unauthorized),
    }


def bulk_paths(unauthorized: dict[str, Any]) -> dict[str, Any]:
    """Bulk retry and redrive by filter (app/admin/bulk.py): one audited action with its count."""
    gateway = _query("gateway", "only this gateway", {"type": "string", "enum": list(registry.GATEWAYS)})
    when = {"type": "string", "maxLength": 40}
    common = [gateway,
              _query("since", "from this time (ISO 8601 with its zone) or age (90s, 15m, 2h, 7d)", when),
              _query("until", "before this time (ISO 8601 with its zone) or age", when),
              _query("limit", f"act on at most this many, oldest first (at most {bulk.MOST_PER_CALL})",
                     {"type": "integer", "minimum": 1, "maximum": bulk.MOST_PER_CALL}),
              _query("dry_run", "true: answer the count, change nothing", {"type": "boolean"})]
    outcome = _json("what was done (or, dry, would be)", {
        "type": "object", "required": ["action", "target", "matched", "acted", "dry_run", "result"],
        "properties": {"action": {"type": "string"}, "target": {"type": "string"}, "result": {"type": "string"},
                       "matched": {"type": "integer"}, "acted": {"type": "integer"},
                       "refused": {"type": "integer"}, "dry_run": {"type": "boolean"},
                       "most_per_call": {"type": "integer"}}})
    return {
        "/api/effects/retry": {"post": {
            "summary": "every effect a filter matches due now: dead ones back to pending (bulk, audited once)",
            "parameters": [_query("state", "dead (default) or pending",
                                  {"type": "string", "enum": list(bulk.EFFECT_STATES)}),
                           _query("type", "the effect's type", {"type": "string", "maxLength": 200}), *common],
            "responses": {"200": outcome, "400": _error(), **unauthorized}}},
        "/api/quarantine/redrive": {"post": {
            "summary": "every set-aside record a filter matches appended again (bulk, audited once)",
            "parameters": [_query("state", "waiting (default: never redriven), redriven or any",
                                  {"type": "string", "enum": list(bulk.QUARANTINE_STATES)}),
                           _query("stage", "the stage that set it aside",
                                  {"type": "string", "enum": list(bulk.STAGES)}),
                           _query("reason", "part of the reason", {"type": "string", "maxLength": 200}), *common],
            "responses": {"200": outcome, "400": _error(), "503": _error(), **unauthorized}}},
    }


def identity_paths(unauthorized: dict[str, Any]) -> dict[str, Any]:
    """Who asks, their personal tokens and the audit trail (docs/security.md)."""
    return {
        "/api/audit": {"get": {
            "summary": "the audit trail (admin_actions), newest first",
            "parameters": [_query("actor", "a person, or person@address", {"type": "string", "maxLength": 200}),
                           _query("action", "e.g. console.login, effects.retry, break-glass, quarantine.view",
                                  {"type": "string", "maxLength": 200}), LIMIT],
            "responses": {"200": _json("actions", ITEMS), "400": _error(), **unauthorized}}},
        "/api/me": {"get": {
            "summary": "who is asking: the person, their role and how they signed in",
            "responses": {"200": _json("the identity", {
                "type": "object", "required": ["person", "role", "via", "source"],
                "properties": {"person": {"type": "string"},
                               "role": {"type": "string", "enum": ["viewer", "operator", "admin"]},
                               "via": {"type": "string", "enum": ["oidc", "break-glass"]},
                               "source": {"type": "string"}}}), **unauthorized}}},
        "/api/tokens": {
            "get": {"summary": "your personal API tokens, with last use (never the tokens themselves)",
                    "responses": {"200": _json("tokens", ITEMS), **unauthorized}},
            "post": {"summary": "a personal API token: shown once, role at most your own, expiry at most 90 days",
                     "requestBody": {"required": True, "content": {"application/json": {"schema": {
                         "type": "object", "required": ["name", "role"],
                         "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 100},
                                        "role": {"type": "string", "enum": ["viewer", "operator", "admin"]},
                                        "expires_days": {"type": "integer", "minimum": 1, "maximum": 90}}}}}},
                     "responses": {"201": _json("the token, shown this once"), "400": _error(), **unauthorized}}},
        "/api/tokens/{token_id}": {"delete": {
            "summary": "revoke one of your personal API tokens",
            "parameters": [_path_param("token_id", "the token's id")],
            "responses": {"200": _json("revoked"), "404": _error(), **unauthorized}}},
    }


def ingest_paths() -> dict[str, Any]:
    gateways = list(registry.GATEWAYS)
    public: list[dict[str, Any]] = []
    return {
        "/webhooks/{gateway}": {"post": {
            "summary": "a gateway's webhook (served by `orderly ingest` on the webhook port)",
            "security": public, "tags": ["ingest"],
            "parameters": [_path_param("gateway", "the gateway", gateways)],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {}}}},
            "responses": {"200": _json("stored durably (or quarantined when signed but unusable)"),
                          "401": _error(), "404": _error(), "408": _error(), "413": _error(), "503": _error()}}},
        "/correlations/pg/deposits/{pg_deposit_id}": {"put": {
            "summary": "the merchant's correlation of a pg deposit (bearer ORDERLY_API_TOKEN, webhook port)",
            "security": [{"correlationToken": []}], "tags": ["ingest"],
            "parameters": [_path_param("pg_deposit_id", "pg's deposit id")],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["merchant_reference", "our_order_id", "our_user_id"],
                "properties": {k: {"type": "string"} for k in ("merchant_reference", "our_order_id",
                                                               "our_user_id")}}}}},
            "responses": {"200": _json("stored (or the same body again)"), "400": _error(), "401": _error(),
                          "409": _error(), "503": _error()}}},
        "/healthz": {"get": {"summary": "liveness", "security": public, "tags": ["ingest"],
                             "responses": {"200": _json("alive")}}},
        "/readyz": {"get": {"summary": "Kafka and PostgreSQL answer now (deadline 2 s)", "security": public,
                            "tags": ["ingest"], "responses": {"200": _json("ready"), "503": _json("not ready")}}},
    }


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "Orderly", "version": VERSION,
                 "description": "The ingest's webhook contract (tag `ingest`, the internet-facing webhook port) "
                                "and the admin API (`orderly admin`, its own port)."},
        "security": ADMIN_AUTH,
        "paths": {**admin_paths(), **ingest_paths()},
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "ORDERLY_ADMIN_TOKEN"},
                "session": {"type": "apiKey", "in": "cookie", "name": "orderly_session",
                            "description": "the console's session (POST /login); POSTs need X-CSRF-Token"},
                "correlationToken": {"type": "http", "scheme": "bearer", "description": "ORDERLY_API_TOKEN"},
            },
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
                "Done": {"type": "object", "required": ["action", "target", "result"],
                         "properties": {k: {"type": "string"} for k in ("action", "target", "result")}},
                "Overview": {"type": "object", "required": [
                    "deliveries", "parked", "open_gaps", "quarantined", "effects_pending", "effects_dead",
                    "consumer_lag", "projector_lag"], "properties": {
                    "deliveries": {"type": "object"}, "parked": {"type": "integer"},
                    "open_gaps": {"type": "integer"}, "quarantined": {"type": "integer"},
                    "effects_pending": {"type": "integer"}, "effects_dead": {"type": "integer"},
                    "consumer_lag": {"type": "array"}, "projector_lag": {"type": ["integer", "null"]}}},
                "Resource": {"type": "object", "required": ["gateway", "resource_id", "state", "timeline", "effects"],
                             "properties": {"gateway": {"type": "string"}, "resource_id": {"type": "string"},
                                            "state": {"type": ["object", "null"]},
                                            "timeline": {"type": "array"}, "effects": {"type": "array"}}},
            },
        },
    }
