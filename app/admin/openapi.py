"""The OpenAPI 3.1 document of everything Orderly serves and sends (schema layer; DESIGN.md §3, §3.1, §3.2).

Served at the admin's ``GET /openapi.json`` (a viewer's, like every admin route): the admin API,
the console's pages and sign-in (HTML, tag ``console``), the ingest's routes on the webhook port
(app/admin/openapi_ingest.py) and, under ``webhooks``, the effect deliveries the merchant receives.
Every operation has an ``operationId``; every JSON answer a component schema generated from
app/admin/shapes.py; every refusal is an RFC 9457 problem document. tests/unit/test_openapi.py
checks it against the OpenAPI 3.1 schema and both apps' routers, the end-to-end tests validate the
answers and deliveries they see against it, and schemathesis fuzzes the admin API from it.
"""

from __future__ import annotations

from http import HTTPStatus
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from app.admin import bulk, resource_search, shapes
from app.admin.openapi_ingest import INGEST_SERVER, delivery_schema, ingest_paths, webhooks
from app.admin.openapi_parts import (
    GUARDED,
    LIMIT,
    Json,
    component_schemas,
    json_body,
    ok,
    operation,
    path_param,
    problems,
    query,
    ref,
    text,
)
from app.gateways import registry

try:
    VERSION = version("orderly")
except PackageNotFoundError:  # run from a checkout that was never installed
    VERSION = "unknown"

ADMIN_SERVER: Json = {"url": "/", "description": "the admin port (`orderly admin`, ORDERLY_ADMIN_PORT), where "
                                                 "this document is served; never the webhook port"}
ADMIN_AUTH: list[Json] = [{"bearer": []}, {"session": []}]
API = ["admin"]


def _api(operation_id: str, summary: str, answer: Json, *refusals: int, why: dict[int, str] | None = None,
         parameters: list[Json] | None = None, body: Json | None = None) -> Json:
    return operation(operation_id, summary, {**answer, **GUARDED, **problems(*refusals, why=why)}, tags=API,
                     parameters=parameters, body=body)


def admin_paths() -> dict[str, Json]:
    gateways = list(registry.GATEWAYS)
    gateway = path_param("gateway", "the gateway", gateways)
    resource = path_param("resource_id", "the gateway's id of the resource")
    delivery = path_param("delivery_id", "the record's delivery id")
    bad_limit = {400: "a parameter out of range (e.g. limit), named in detail"}
    return {
        "/api/overview": {"get": _api("getOverview", "counts: deliveries by outcome, parked, gaps, quarantine, effects "
                                      "(one count shared by every reader: counted_at), consumer lag",
                                      ok("the counts", shapes.Overview), 503,
                                      why={503: "PostgreSQL is not reachable, or no count has finished yet (the "
                                                "first still running past 10 s, or the last failed): detail says"})},
        "/api/resources": {"get": _api(
            "searchResources", "search resources, newest delivery first, cursor-paginated",
            ok("a page", shapes.ResourcePage), 400, why={400: "an unknown gateway, a parameter too long, or a "
                                                         "cursor this API did not hand out"},
            parameters=[query("gateway", "only this gateway", {"type": "string", "enum": gateways}),
                        query("status", "the resource's status (e.g. paid, captured), or `parked`",
                              {"type": "string", "maxLength": 200}),
                        query("q", "a whole resource id, gateway event id or delivery id (that id's resources "
                              "only), else part of a resource id",
                              {"type": "string", "maxLength": resource_search.Q_MAX}),
                        query("match", "`part`: q is part of a resource id even when it is a whole id too",
                              {"type": "string", "enum": list(resource_search.MATCHES), "default": "auto"}),
                        LIMIT, query("cursor", "next_cursor of the previous page", {"type": "string"})])},
        "/api/resources/{gateway}/{resource_id}": {"get": _api(
            "getResource", "current state, the decision timeline and the effects emitted",
            ok("the resource", shapes.Resource), 400, 404, parameters=[gateway, resource, query(
                "order", "the timeline in arrival (default) or gateway order; each delivery has both positions "
                "and `late` either way", {"type": "string", "enum": ["arrival", "gateway"]})],
            why={404: "an unknown gateway or resource"})},
        "/api/resources/{gateway}/{resource_id}/fetch": {"post": _api(
            "fetchResource", "ask the gateway for the resource now (a payment's fetch; pg: backfill of open gaps)",
            ok("requested", shapes.Done), 400, 404, 409, 422,
            why={409: "nothing to fetch (pg: no open gap)", 422: "the gateway has no API, or none is configured",
                 503: "Kafka or PostgreSQL is not reachable: nothing was done"}, parameters=[gateway, resource])},
        "/api/parked": {"get": _api(
            "listParked", "resources holding parked deliveries, oldest first, with why, and `overdue` once parked "
            "longer than ORDERLY_PARKED_ALERT_AFTER_S", ok("parked resources", shapes.ParkedList), 400,
            why=bad_limit, parameters=[LIMIT])},
        "/api/gaps": {"get": _api("listGaps", "open pg sequence gaps with age and backfill status",
                                  ok("open gaps", shapes.GapList), 400, why=bad_limit, parameters=[LIMIT])},
        "/api/quarantine": {"get": _api(
            "listQuarantine", "records set aside by any stage, newest first", ok("set-aside records",
                                                                                 shapes.QuarantineList), 400,
            parameters=[query("stage", "ingest, worker, projector, effects or fetcher",
                              {"type": "string", "maxLength": 200}),
                        query("gateway", "only this gateway", {"type": "string", "enum": gateways}), LIMIT])},
        "/api/quarantine/{delivery_id}": {"get": _api(
            "getQuarantined", "one set-aside record with its headers and body (an operator's; the view is audited)",
            ok("the record", shapes.QuarantinedRecord), 400, 404, parameters=[delivery])},
        "/api/quarantine/{delivery_id}/redrive": {"post": _api(
            "redriveQuarantined", "append the stored body again where it was set aside from",
            ok("appended", shapes.Done), 400, 404, 409,
            why={409: "still refused by its adapter, or nowhere to route it",
                 503: "Kafka or PostgreSQL is not reachable: look at the timeline before you repeat it"},
            parameters=[delivery])},
        "/api/effects": {"get": _api(
            "listEffects", "effects by delivery state, newest first, with attempts and last error",
            ok("effects", shapes.EffectList), 400,
            parameters=[query("state", "dead (default), pending or delivered",
                              {"type": "string", "enum": ["pending", "dead", "delivered"]}), LIMIT])},
        "/api/effects/{dedupe_key}/retry": {"post": _api(
            "retryEffect", "a dead effect back to pending", ok("pending again", shapes.Done), 400, 404, 409,
            why={409: "the effect is not dead (pending, or already delivered)"},
            parameters=[path_param("dedupe_key", "the effect's dedupe key")])},
        **identity_paths(),
        **bulk_paths(),
    }


def bulk_paths() -> dict[str, Json]:
    """Bulk retry and redrive by filter (app/admin/bulk.py): one audited action with its count."""
    when = {"type": "string", "maxLength": 40}
    common = [query("gateway", "only this gateway", {"type": "string", "enum": list(registry.GATEWAYS)}),
              query("since", "from this time (ISO 8601 with its zone) or age (90s, 15m, 2h, 7d)", when),
              query("until", "before this time (ISO 8601 with its zone) or age", when),
              query("limit", f"act on at most this many, oldest first (at most {bulk.MOST_PER_CALL})",
                    {"type": "integer", "minimum": 1, "maximum": bulk.MOST_PER_CALL}),
              query("dry_run", "true: answer the count, change nothing", {"type": "boolean"})]
    bad = {400: "a filter out of range (an unknown state, a time without its zone), named in detail"}
    return {
        "/api/effects/retry": {"post": _api(
            "retryEffectsBulk", "every effect a filter matches due now: dead ones back to pending (bulk, audited "
            "once)", ok("what was done (or, dry, would be)", shapes.BulkOutcome), 400, why=bad,
            parameters=[query("state", "dead (default) or pending", {"type": "string",
                                                                     "enum": list(bulk.EFFECT_STATES)}),
                        query("type", "the effect's type", {"type": "string", "maxLength": 200}), *common])},
        "/api/quarantine/redrive": {"post": _api(
            "redriveQuarantinedBulk", "every set-aside record a filter matches appended again (bulk, audited once)",
            ok("what was done (or, dry, would be)", shapes.BulkOutcome), 400, why=bad,
            parameters=[query("state", "waiting (default: never redriven), redriven or any",
                              {"type": "string", "enum": list(bulk.QUARANTINE_STATES)}),
                        query("stage", "the stage that set it aside", {"type": "string", "enum": list(bulk.STAGES)}),
                        query("reason", "part of the reason", {"type": "string", "maxLength": 200}), *common])},
    }


def identity_paths() -> dict[str, Json]:
    """Who asks, their personal tokens and the audit trail (docs/security.md)."""
    return {
        "/api/audit": {"get": _api(
            "listAudit", "the audit trail (admin_actions), newest first", ok("actions", shapes.AuditList), 400,
            parameters=[query("actor", "a person, or person@address", {"type": "string", "maxLength": 200}),
                        query("action", "e.g. console.login, effects.retry, break-glass, quarantine.view",
                              {"type": "string", "maxLength": 200}), LIMIT])},
        "/api/me": {"get": _api("getMe", "who is asking: the person, their role and how they signed in",
                                ok("the identity", shapes.Me))},
        "/api/tokens": {
            "get": _api("listTokens", "your personal API tokens, with last use (never the tokens themselves)",
                        ok("tokens", shapes.TokenList)),
            "post": _api("createToken", "a personal API token: shown once, role at most your own, expiry at most "
                         "90 days (a person signed in through the issuer only)",
                         ok("the token, shown this once", shapes.TokenCreated, 201), 400,
                         body=json_body(shapes.TokenRequest, "the token's name, role and days to expiry"))},
        "/api/tokens/{token_id}": {"delete": _api(
            "revokeToken", "revoke one of your personal API tokens", ok("revoked", shapes.Revoked), 404,
            parameters=[path_param("token_id", "the token's id")])},
        "/openapi.json": {"get": _api("getOpenApi", "this document", ok("the OpenAPI 3.1 document", {
            "type": "object", "required": ["openapi", "info", "paths"]}))},
        "/healthz": {"servers": [ADMIN_SERVER, INGEST_SERVER], "get": operation(
            "getHealth", "liveness, of the admin and of the ingest", ok("alive", shapes.Health),
            tags=[*API, "ingest"], security=[])},
    }


def _refused(*statuses: int) -> Json:
    """A page's refusals: a page saying why (text/html), or the guard's one line (text/plain)."""
    return {str(status): {"description": HTTPStatus(status).phrase,
                          "content": {"text/html": {"schema": {"type": "string"}},
                                      "text/plain": {"schema": {"type": "string"}}}} for status in statuses}


PAGE_REFUSED = _refused(400, 403, 404, 500, 503)


def _page(operation_id: str, summary: str, parameters: list[Json] | None = None) -> Json:
    return operation(operation_id, summary, {**text(200, "the page", "text/html"),
                                             **text(303, "no session: to the sign-in page"), **PAGE_REFUSED},
                     tags=["console"], parameters=parameters)


def _form(operation_id: str, summary: str, parameters: list[Json] | None = None, public: bool = False,
          answers: Json | None = None) -> Json:
    return operation(operation_id, summary, answers or {**text(303, "done (or refused): back to a page with the "
                                                                    "result"), **_refused(401, 408), **PAGE_REFUSED},
                     tags=["console"], parameters=parameters, security=[] if public else None,
                     body={"required": False, "description": "the page's form, with its `csrf` field",
                           "content": {"application/x-www-form-urlencoded": {"schema": {"type": "object"}}}})


def console_paths() -> dict[str, Json]:
    """The console's HTML pages and sign-in (DESIGN.md §3.1): for people, over the same queries."""
    gateway = path_param("gateway", "the gateway", list(registry.GATEWAYS))
    resource = path_param("resource_id", "the gateway's id of the resource")
    delivery = path_param("delivery_id", "the record's delivery id")
    return {
        "/": {"get": _page("consoleOverview", "the overview page")},
        "/resources": {"get": _page("consoleResources", "the resource search page")},
        "/resources/{gateway}/{resource_id}": {"get": _page("consoleResource", "a resource's page: state, timeline, "
                                                            "effects", [gateway, resource])},
        "/resources/{gateway}/{resource_id}/fetch": {"post": _form("consoleFetch", "ask the gateway for it now",
                                                                   [gateway, resource])},
        "/parked": {"get": _page("consoleParked", "the parked page")},
        "/gaps": {"get": _page("consoleGaps", "the gaps page")},
        "/quarantine": {"get": _page("consoleQuarantine", "the quarantine page")},
        "/quarantine/{delivery_id}": {"get": _page("consoleQuarantined", "one set-aside record", [delivery])},
        "/quarantine/{delivery_id}/redrive": {"post": _form("consoleRedrive", "redrive it", [delivery])},
        "/quarantine/redrive": {"post": _form("consoleRedriveBulk", "count, or redrive, every record the form's "
                                              "filter matches (one audit row)")},
        "/effects": {"get": _page("consoleEffects", "the effects page")},
        "/effects/retry": {"post": _form("consoleRetryBulk", "count, or retry, every effect the form's filter "
                                         "matches (one audit row)")},
        "/effects/{dedupe_key}/retry": {"post": _form("consoleRetry", "a dead effect back to pending",
                                                      [path_param("dedupe_key", "the effect's dedupe key")])},
        "/audit": {"get": _page("consoleAudit", "the audit trail page")},
        "/tokens": {"get": _page("consoleTokens", "your personal API tokens (an admin's)"),
                    "post": _form("consoleCreateToken", "make a personal API token, shown once on the page that "
                                  "answers", answers={**text(200, "the page with the new token, shown this once",
                                                             "text/html"), **_refused(401, 408), **PAGE_REFUSED})},
        "/tokens/{token_id}/revoke": {"post": _form("consoleRevokeToken", "revoke one of your personal API tokens",
                                                    [path_param("token_id", "the token's id")])},
        "/static/{filename}": {"get": operation("consoleStatic", "the console's stylesheet and script",
                                                {"200": {"description": "the file", "content": {
                                                    media: {"schema": {"type": "string"}} for media in
                                                    ("text/css", "text/javascript", "application/javascript")}},
                                                 **text(404, "no such file")},
                                                tags=["console"], security=[],
                                                parameters=[path_param("filename", "console.css or console.js")])},
        "/login": {"get": operation("signInPage", "the sign-in page", {**text(200, "the page", "text/html"),
                                                                       **_refused(500, 503)},
                                    tags=["console"], security=[]),
                   "post": _form("signInWithToken", "sign in with the break-glass token (when it is set)",
                                 public=True, answers={**text(303, "signed in: to where the person was going"),
                                                       **_refused(400, 401, 404, 408, 429, 500, 503)})},
        "/auth/start": {"get": operation("signInStart", "to the OpenID Connect issuer (authorization code, PKCE)",
                                         {**text(303, "to the issuer"), **_refused(404, 500, 502, 503)},
                                         tags=["console"], security=[])},
        "/auth/callback": {"get": operation("signInCallback", "back from the issuer: a session, or the reason not",
                                            {**text(303, "signed in: to where the person was going"),
                                             **_refused(400, 401, 403, 500, 503)},
                                            tags=["console"], security=[])},
        "/logout": {"post": _form("signOut", "end the session")},
    }


def readiness_path() -> Json:
    """/readyz on both ports: the ingest's (Kafka and PostgreSQL) and the admin's (PostgreSQL)."""
    answer = {"oneOf": [ref(shapes.Readiness), ref(shapes.ProcessReadiness)]}
    return {"servers": [ADMIN_SERVER, INGEST_SERVER], "get": operation(
        "getReadiness", "ready now: the ingest when Kafka answers (PostgreSQL reported beside it), the admin "
        "when PostgreSQL answers; each within 2 s", {**ok("ready", answer), "503": {
            "description": "not ready: what did not answer, and why",
            "content": {"application/json": {"schema": answer}}}}, tags=[*API, "ingest"], security=[])}


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "Orderly", "version": VERSION,
                 "description": "The admin API (`orderly admin`, its own port, tag `admin`), the console's pages "
                                "(tag `console`), the ingest's webhook contract (tag `ingest`, the internet-facing "
                                "webhook port) and, under `webhooks`, the effect deliveries Orderly sends the "
                                "merchant. Refusals are RFC 9457 problem documents (application/problem+json)."},
        "servers": [ADMIN_SERVER],
        "security": ADMIN_AUTH,
        "tags": [{"name": "admin", "description": "the admin API, JSON"},
                 {"name": "console", "description": "the console's HTML pages and sign-in, for people"},
                 {"name": "ingest", "description": "the webhook port (`orderly ingest`)"},
                 {"name": "effects", "description": "what Orderly sends the merchant (`orderly effects`)"}],
        "paths": {**admin_paths(), **console_paths(), **ingest_paths(), "/readyz": readiness_path()},
        "webhooks": webhooks(),
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "a personal API token (`oat_…`), or the break-glass ORDERLY_ADMIN_TOKEN"},
                "session": {"type": "apiKey", "in": "cookie", "name": "orderly_session",
                            "description": "the console's session (OpenID Connect sign-in); POSTs need X-CSRF-Token"},
                "correlationToken": {"type": "http", "scheme": "bearer", "description": "ORDERLY_API_TOKEN"},
            },
            "schemas": {**component_schemas(), "EffectDelivery": delivery_schema()},
        },
    }
