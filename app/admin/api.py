"""The admin API: JSON reads and audited actions under /api/, its OpenAPI document and health (I/O shell).

Its /metrics is not here: the admin serves it on a bind of its own like every process (app/admin/app.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from app.admin import actions, bulk, queries, resource_search, timeline
from app.admin.context import ADMIN, IDENTITY, Admin
from app.admin.http import ID, Refused, json_response, kafka_producer, path_id, problem, text_param
from app.admin.openapi import document
from app.admin.overview import NoCounts
from app.gateways import registry
from app.gateways.limits import id_error
from app.producer import KeyedProducer
from app.readiness import PROBE_DEADLINE_S, UNREACHABLE
from app.waits import within
from projections import quarantine
from projections.bulk import Conn

log = logging.getLogger("orderly.admin")


def _limit(request: web.Request, default: int = 50, most: int = 500) -> int:
    raw = request.query.get("limit")
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= most:
        raise Refused(400, f"limit must be an integer from 1 to {most}")
    return int(raw)


def _match(value: str | None) -> str:
    if value and value not in resource_search.MATCHES:
        raise Refused(400, f"match must be one of {', '.join(resource_search.MATCHES)}")
    return value or "auto"


def _gateway(value: str | None, required: bool = False) -> str | None:
    if not value:
        if required:
            raise Refused(404, "unknown gateway")
        return None
    if registry.find(value) is None:
        known = ", ".join(registry.GATEWAYS)
        raise Refused(400, f"unknown gateway {value!r}; known: {known}")
    return value


async def overview_body(admin: Admin) -> dict[str, Any]:
    """The overview, as the API answers it and the console's first page shows it."""
    try:
        counts = await admin.counts.read()
    except NoCounts as exc:
        raise Refused(503, str(exc)) from None
    projector = [g for g in admin.lag["groups"] if g["group"] == "projector"]
    return {**counts, "consumer_lag": admin.lag["groups"], "lag_error": admin.lag.get("error"),
            "projector_lag": projector[0]["lag"] if projector else None}


async def api_overview(request: web.Request) -> web.Response:
    return json_response(await overview_body(request.app[ADMIN]))


async def api_resource(request: web.Request) -> web.Response:
    gateway, resource_id = request.match_info["gateway"], request.match_info["resource_id"]
    if registry.find(gateway) is None:
        return problem(404, f"unknown gateway {gateway!r}")
    error = id_error("resource_id", resource_id)
    if error:
        return problem(400, error)
    order = timeline.order_of(request.query.get("order"))
    if order is None:
        return problem(400, f"order must be one of {', '.join(timeline.ORDERS)}")
    async with request.app[ADMIN].db() as conn:
        body = await queries.resource(conn, gateway, resource_id, order)
    return json_response(body) if body is not None else problem(404, f"no {gateway} resource {resource_id!r}")


async def api_search(request: web.Request) -> web.Response:
    q = request.query
    try:
        async with request.app[ADMIN].db() as conn:
            found = await resource_search.search(conn, _gateway(q.get("gateway")), text_param(request, "status"),
                                                 text_param(request, "q", resource_search.Q_MAX), _limit(request),
                                                 text_param(request, "cursor", 2000), _match(q.get("match")))
    except resource_search.BadCursor as exc:
        return problem(400, str(exc))
    return json_response(found)


async def api_parked(request: web.Request) -> web.Response:
    async with request.app[ADMIN].db() as conn:
        return json_response({"items": await queries.parked(conn, _limit(request, 200),
                                                            request.app[ADMIN].settings.parked_alert_after_s)})


async def api_gaps(request: web.Request) -> web.Response:
    async with request.app[ADMIN].db() as conn:
        return json_response({"items": await queries.gaps(conn, _limit(request, 200))})


async def api_quarantine(request: web.Request) -> web.Response:
    stage = text_param(request, "stage")
    async with request.app[ADMIN].db() as conn:
        rows = await quarantine.listing(conn, stage, _gateway(request.query.get("gateway")), _limit(request))
    return json_response({"items": rows})


async def api_quarantined(request: web.Request) -> web.Response:
    delivery_id = path_id(request, "delivery_id")
    admin = request.app[ADMIN]
    async with admin.db() as conn:
        found = await quarantine.one(conn, delivery_id)
        await queries.audit(conn, admin.actor(request), "quarantine.view", delivery_id,
                            "shown" if found is not None else "not found")
    if found is None:
        return problem(404, f"no quarantined record {delivery_id!r}")
    body = bytes(found.pop("body"))
    found.pop("record_key", None)
    found["headers"] = [list(pair) for pair in found["headers"]]
    found["body"] = body.decode("utf-8", "replace")
    found["body_bytes"] = len(body)
    return json_response(found)


async def _act(request: web.Request, action: Callable[[Conn], Awaitable[actions.Done]]) -> web.Response:
    admin = request.app[ADMIN]
    async with admin.acting, admin.db() as conn:
        try:
            done = await action(conn)
        except actions.ActionRefused as exc:
            admin.metrics.actions.labels(request.match_info.route.name or "action", "refused").inc()
            return problem(exc.status, str(exc))
    admin.metrics.actions.labels(done.action, "done").inc()
    log.info("%s by %s on %s: %s", done.action, admin.actor(request), done.target, done.result)
    return json_response({"action": done.action, "target": done.target, "result": done.result})


async def api_redrive(request: web.Request) -> web.Response:
    admin = request.app[ADMIN]
    producer = await kafka_producer(admin)
    if isinstance(producer, web.Response):
        return producer
    delivery_id = path_id(request, "delivery_id")
    return await _act(request, lambda conn: actions.redrive(
        conn, producer, admin.names, delivery_id, int(time.time() * 1000), admin.actor(request)))


async def api_effects(request: web.Request) -> web.Response:
    state = request.query.get("state", "dead")  # what the on-call engineer asks first, as in the console
    if state not in queries.EFFECT_STATES:
        return problem(400, f"state must be one of {', '.join(queries.EFFECT_STATES)}")
    async with request.app[ADMIN].db() as conn:
        return json_response({"items": await queries.effects(conn, state, _limit(request, 100))})


async def api_retry(request: web.Request) -> web.Response:
    admin = request.app[ADMIN]
    dedupe_key = path_id(request, "dedupe_key")
    return await _act(request, lambda conn: actions.retry_effect(conn, dedupe_key, admin.actor(request)))


async def _bulk(request: web.Request, kind: bulk.Kind,
                action: Callable[[Conn, bulk.Filter, bool], Awaitable[bulk.Outcome]]) -> web.Response:
    """A bulk action by the filter in the query; ``dry_run=true`` answers the count only."""
    admin = request.app[ADMIN]
    try:
        found = bulk.parse_filter(kind, request.query, datetime.now(UTC))
        dry_run = bulk.dry_run_flag(request.query.get("dry_run"))
    except bulk.BadFilter as exc:
        return problem(400, str(exc))
    async with admin.acting, admin.db() as conn:
        try:
            done = await action(conn, found, dry_run)
        except actions.ActionRefused as exc:
            admin.metrics.actions.labels(request.match_info.route.name or "action", "refused").inc()
            return problem(exc.status, str(exc))
    if not dry_run:
        admin.metrics.actions.labels(done.action, "done").inc()
        log.info("%s by %s on %s: %s", done.action, admin.actor(request), done.target, done.result)
    return json_response(done.body())


async def api_retry_bulk(request: web.Request) -> web.Response:
    actor, lease_s = request.app[ADMIN].actor(request), request.app[ADMIN].settings.effects_lease_s
    return await _bulk(request, "effects", lambda conn, f, dry: bulk.retry_effects(conn, f, actor, dry, lease_s))


async def api_redrive_bulk(request: web.Request) -> web.Response:
    admin = request.app[ADMIN]
    producer: KeyedProducer | None = None
    if request.query.get("dry_run") not in ("true", "1"):  # a dry run counts without Kafka
        found = await kafka_producer(admin)
        if isinstance(found, web.Response):
            return found
        producer = found
    actor = admin.actor(request)
    return await _bulk(request, "quarantine", lambda conn, f, dry: bulk.redrive_quarantined(
        conn, producer, admin.names, f, int(time.time() * 1000), actor, dry))


async def api_fetch(request: web.Request) -> web.Response:
    admin = request.app[ADMIN]
    gateway, resource_id = request.match_info["gateway"], request.match_info["resource_id"]
    if registry.find(gateway) is None:
        return problem(404, f"unknown gateway {gateway!r}")
    producer = await kafka_producer(admin)
    if isinstance(producer, web.Response):
        return producer
    return await _act(request, lambda conn: actions.request_fetch(
        conn, producer, admin.names, gateway, resource_id, admin.actor(request), admin.fetch_api(gateway)))


async def api_audit(request: web.Request) -> web.Response:
    """The audit trail, newest first; ``actor`` (a person, or ``person@address``), ``action`` filter."""
    actor, action = text_param(request, "actor"), text_param(request, "action")
    async with request.app[ADMIN].db() as conn:
        return json_response({"items": await queries.audit_log(conn, _limit(request), actor, action)})


async def api_me(request: web.Request) -> web.Response:
    identity = request[IDENTITY]
    return json_response({"person": identity.person, "role": identity.role, "via": identity.via,
                          "source": request.app[ADMIN].source(request)})


async def openapi(request: web.Request) -> web.Response:
    return json_response(document())


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """PostgreSQL answers now (within 2 s): everything the admin shows is read there. Not ready, it
    says why; its requests answer 503 meanwhile and it resumes by itself (the pool reconnects)."""
    admin = request.app[ADMIN]
    assert admin.pool is not None
    try:
        await within(admin.pool.fetchval("SELECT 1"), PROBE_DEADLINE_S)
    except UNREACHABLE as exc:
        admin.readiness.down("postgres", exc)
    else:
        admin.readiness.up("postgres")
    status, body = admin.readiness.answer(public=True)  # no credential asked (guard.PUBLIC)
    return json_response(body, status=status)


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/overview", api_overview)
    r.add_get("/api/resources", api_search)
    r.add_post(f"/api/resources/{{gateway}}/{{resource_id:{ID}}}/fetch", api_fetch, name="resources.fetch")
    r.add_get(f"/api/resources/{{gateway}}/{{resource_id:{ID}}}", api_resource)
    r.add_get("/api/parked", api_parked)
    r.add_get("/api/gaps", api_gaps)
    r.add_get("/api/quarantine", api_quarantine)
    r.add_post("/api/quarantine/redrive", api_redrive_bulk, name="quarantine.redrive.bulk")
    r.add_post(f"/api/quarantine/{{delivery_id:{ID}}}/redrive", api_redrive, name="quarantine.redrive")
    r.add_get(f"/api/quarantine/{{delivery_id:{ID}}}", api_quarantined)
    r.add_get("/api/effects", api_effects)
    r.add_post("/api/effects/retry", api_retry_bulk, name="effects.retry.bulk")
    r.add_post(f"/api/effects/{{dedupe_key:{ID}}}/retry", api_retry, name="effects.retry")
    r.add_get("/api/audit", api_audit)
    r.add_get("/api/me", api_me)
    r.add_get("/openapi.json", openapi)
    r.add_get("/healthz", healthz)
    r.add_get("/readyz", readyz)
