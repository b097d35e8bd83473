"""The console: server-rendered pages over the admin API's queries and actions (I/O shell;
DESIGN.md §3.1). Jinja2 templates with autoescaping, one stylesheet, one small script that
refreshes the overview's counts; every page works without it. Every form POST carries the
session's CSRF token (checked in app/admin/guard.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
import orjson
from aiohttp import web

from app.admin import actions, auth, bulk, display, queries, resource_search, timeline
from app.admin.api import overview_body
from app.admin.context import ADMIN, IDENTITY, Admin
from app.admin.http import ID, form, kafka_producer, path_id, redirect, safe_next, text_param
from app.gateways import registry
from app.producer import KeyedProducer
from app.settings import Settings
from projections import quarantine

HERE = Path(__file__).parent
OUTCOMES = ("applied", "unparked", "synced", "parked", "stale", "duplicate", "quarantined")


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return display.zoned(value)  # with its zone: a time without one is a guess elsewhere
    return "" if value is None else str(value)


def _ago(value: Any) -> str:
    if not isinstance(value, datetime):
        return ""
    seconds = max(0, int(time.time() - value.timestamp()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def _pretty(value: Any) -> str:
    # orjson, as the API answers: it writes datetimes itself, and jsonable covers the rest
    return orjson.dumps(value, default=queries.jsonable, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                         undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
ENV.filters.update(when=_when, ago=_ago, pretty=_pretty, q=lambda v: quote(str(v), safe=""),
                   gateway_time=display.gateway_time, amount=display.delivery_amount, amounts=display.amounts)


def fetching(settings: Settings) -> dict[str, list[str]]:
    """The enabled gateways the fetcher can ask (their registry line's ``fetch``): by resource
    (``fetched``; ``fetchable`` those whose API URL is set) and by sequence (``sequenced``; ``backfilled``)."""
    lines = [(g, g.fetch, settings.api_urls.get(g.name)) for name in settings.gateways
             if (g := registry.find(name)) is not None and g.fetch is not None]
    return {"fetched": [g.name for g, f, _ in lines if f.resource],
            "sequenced": [g.name for g, f, _ in lines if f.backfill],
            "fetchable": [g.name for g, f, url in lines if f.resource and url],
            "backfilled": [g.name for g, f, url in lines if f.backfill and url]}


def render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    admin = request.app[ADMIN]
    identity = request.get(IDENTITY)
    mac = request.query.get("m")
    shown = {kind: text for kind in ("done", "refused")
             if (text := request.query.get(kind)) and auth.flash_ok(admin.flash_key, f"{kind}:{text}", mac)}
    settings = admin.settings
    page = ENV.get_template(template).render(
        csrf=identity.csrf or "" if identity else "", path=request.path_qs, identity=identity,
        break_glass_on=identity is not None and identity.via == auth.BREAK_GLASS,
        flash=shown.get("done"), refused=shown.get("refused"), gateways=list(registry.GATEWAYS),
        namespace=settings.namespace, signed_in=identity is not None and identity.session is not None,
        delivering=settings.effects_url is not None, **fetching(settings), **context)
    return web.Response(text=page, status=status, content_type="text/html")


# --- pages ------------------------------------------------------------------------------------

async def overview(request: web.Request) -> web.Response:
    body = await overview_body(request.app[ADMIN])
    if request.query.get("partial") == "counts":  # the refresh of the counts only: not the recent resources
        return render(request, "counts.html", o=body, outcomes=OUTCOMES)
    async with request.app[ADMIN].db() as conn:
        recent = await resource_search.search(conn, limit=10)
    return render(request, "overview.html", o=body, outcomes=OUTCOMES, recent=recent["items"])


async def resources(request: web.Request) -> web.Response:
    q = request.query
    gateway = q.get("gateway") or None
    if gateway is not None and registry.find(gateway) is None:
        gateway = None
    text = (q.get("q") or "")[:resource_search.Q_MAX] or None
    cursor = q.get("cursor") or None
    try:
        async with request.app[ADMIN].db() as conn:
            match = "part" if q.get("match") == "part" else "auto"
            found = await resource_search.search(conn, gateway, q.get("status") or None, text, 50, cursor, match)
            # said on the first page: a delivery id searched for that was set aside, with its redrives
            redrives = await resource_search.set_aside(conn, text, gateway) if text and not cursor else None
    except resource_search.BadCursor as exc:
        return render(request, "message.html", status=400, title="Search", message=str(exc))
    more = None
    if found["next_cursor"]:
        more = "/resources?" + urlencode({k: v for k, v in {**q, "cursor": found["next_cursor"]}.items() if v})
    part = "/resources?" + urlencode({k: v for k, v in {**q, "match": "part", "cursor": ""}.items() if v})
    return render(request, "resources.html", items=found["items"], more=more, query=dict(q),
                  set_aside=None if redrives is None else (text, redrives),
                  whole=part if found["match"] == "whole" and not cursor else None)


async def resource(request: web.Request) -> web.Response:
    gateway, resource_id = request.match_info["gateway"], path_id(request, "resource_id")
    order = timeline.order_of(request.query.get("order")) or "arrival"
    body = None
    if registry.find(gateway) is not None:
        async with request.app[ADMIN].db() as conn:
            body = await queries.resource(conn, gateway, resource_id, order)
    if body is None:
        return render(request, "message.html", status=404, title="Not found",
                      message=f"no {gateway} resource {resource_id!r}")
    state = dict(body["state"] or {})
    return render(request, "resource.html", r=body, state=state)


async def parked(request: web.Request) -> web.Response:
    async with request.app[ADMIN].db() as conn:
        items = await queries.parked(conn, overdue_after_s=request.app[ADMIN].settings.parked_alert_after_s)
    settings = request.app[ADMIN].settings
    return render(request, "parked.html", items=items, fetch_after_s=settings.fetch_parked_after_s,
                  alert_after_s=settings.parked_alert_after_s)


async def gaps(request: web.Request) -> web.Response:
    async with request.app[ADMIN].db() as conn:
        items = await queries.gaps(conn)
    return render(request, "gaps.html", items=items,
                  backfill_after_s=request.app[ADMIN].settings.gap_backfill_after_s)


async def quarantine_list(request: web.Request) -> web.Response:
    stage = text_param(request, "stage")
    async with request.app[ADMIN].db() as conn:
        items = await quarantine.listing(conn, stage, None, 200)
    return render(request, "quarantine.html", items=items, stage=stage or "", stages=bulk.STAGES,
                  most=bulk.MOST_PER_CALL)


async def quarantine_one(request: web.Request) -> web.Response:
    delivery_id = path_id(request, "delivery_id")
    admin = request.app[ADMIN]
    async with admin.db() as conn:
        found = await quarantine.one(conn, delivery_id)
        await queries.audit(conn, admin.actor(request), "quarantine.view", delivery_id,
                            "shown" if found is not None else "not found")
    if found is None:
        return render(request, "message.html", status=404, title="Not found",
                      message=f"no quarantined record {delivery_id!r}")
    raw = bytes(found.pop("body"))
    try:
        body = _pretty(orjson.loads(raw))
    except (orjson.JSONDecodeError, TypeError):  # not JSON, or nested past what orjson writes (254 levels)
        body = raw[:20_000].decode("utf-8", "replace")
    return render(request, "quarantined.html", rec=found, body=body, size=len(raw))


async def effects(request: web.Request) -> web.Response:
    state = request.query.get("state", "dead")
    if state not in queries.EFFECT_STATES:
        state = "dead"
    async with request.app[ADMIN].db() as conn:
        items = await queries.effects(conn, state, 200)
        counted = await queries.effect_counts(conn)
    cap = queries.EFFECT_COUNT_CAP
    counts = {name: f"{cap:,}+" if n > cap else f"{n:,}" for name, n in counted.items()}  # "1,234", "100,000+"
    return render(request, "effects.html", items=items, state=state, counts=counts, most=bulk.MOST_PER_CALL)


async def audit(request: web.Request) -> web.Response:
    async with request.app[ADMIN].db() as conn:
        items = await queries.audit_log(conn, 200)
    return render(request, "audit.html", items=items)


# --- actions ----------------------------------------------------------------------------------

async def _acted(request: web.Request, admin: Admin, run: Any) -> web.StreamResponse:
    posted = await form(request)
    target = safe_next(str(posted.get("next", "/")))
    async with admin.acting, admin.db() as conn:
        try:
            done = await run(conn)
        except actions.ActionRefused as exc:
            admin.metrics.actions.labels(request.match_info.route.name or "action", "refused").inc()
            return redirect(_with(admin, target, "refused", str(exc)))
    admin.metrics.actions.labels(done.action, "done").inc()
    return redirect(_with(admin, target, "done", f"{done.action} {done.target}: {done.result}"))


def _with(admin: Admin, target: str, kind: str, text: str) -> str:
    """``target`` with a message the page shows (only with its MAC: a link cannot forge one)."""
    path = target.split("?", 1)[0]
    return f"{path}?{urlencode({kind: text, 'm': auth.flash_mac(admin.flash_key, f'{kind}:{text}')})}"


async def redrive(request: web.Request) -> web.StreamResponse:
    admin = request.app[ADMIN]
    producer = await kafka_producer(admin)
    if isinstance(producer, web.Response):
        return redirect(_with(admin, "/quarantine", "refused", "Kafka is not reachable, nothing was done"))
    delivery_id = path_id(request, "delivery_id")
    return await _acted(request, admin, lambda conn: actions.redrive(
        conn, producer, admin.names, delivery_id, int(time.time() * 1000), admin.actor(request)))


async def retry(request: web.Request) -> web.StreamResponse:
    admin = request.app[ADMIN]
    dedupe_key = path_id(request, "dedupe_key")
    return await _acted(request, admin, lambda conn: actions.retry_effect(conn, dedupe_key, admin.actor(request)))


async def fetch(request: web.Request) -> web.StreamResponse:
    admin = request.app[ADMIN]
    gateway = request.match_info["gateway"]
    producer = await kafka_producer(admin)
    if isinstance(producer, web.Response) or registry.find(gateway) is None:
        return redirect(_with(admin, request.path.rsplit("/fetch", 1)[0], "refused",
                              "nothing was done: Kafka is not reachable or the gateway is unknown"))
    return await _acted(request, admin, lambda conn: actions.request_fetch(
        conn, producer, admin.names, gateway, request.match_info["resource_id"], admin.actor(request),
        admin.fetch_api(gateway)))


BULK_FIELDS = ("gateway", "type", "stage", "state", "reason", "since", "until", "limit")


async def _bulk(request: web.Request, kind: bulk.Kind, page: str,
                act: Callable[[Any, bulk.Filter, bool], Awaitable[bulk.Outcome]]) -> web.StreamResponse:
    """A bulk form: "Count" (a dry run) or act on every match, the outcome as the page's message."""
    admin = request.app[ADMIN]
    posted = await form(request)
    given = {name: str(posted[name]) for name in BULK_FIELDS if posted.get(name)}
    dry_run = posted.get("dry_run") != "false"  # only the button that says so acts
    try:
        found = bulk.parse_filter(kind, given, datetime.now(UTC))
    except bulk.BadFilter as exc:
        return redirect(_with(admin, page, "refused", str(exc)))
    async with admin.acting, admin.db() as conn:
        try:
            done = await act(conn, found, dry_run)
        except actions.ActionRefused as exc:
            admin.metrics.actions.labels(request.match_info.route.name or "action", "refused").inc()
            return redirect(_with(admin, page, "refused", str(exc)))
    if not dry_run:
        admin.metrics.actions.labels(done.action, "done").inc()
    return redirect(_with(admin, page, "done", f"{done.action} {done.target}: {done.result}"))


async def retry_bulk(request: web.Request) -> web.StreamResponse:
    actor, lease_s = request.app[ADMIN].actor(request), request.app[ADMIN].settings.effects_lease_s
    return await _bulk(request, "effects", "/effects",
                       lambda conn, f, dry: bulk.retry_effects(conn, f, actor, dry, lease_s))


async def redrive_bulk(request: web.Request) -> web.StreamResponse:
    admin = request.app[ADMIN]
    producer: KeyedProducer | None = None
    if (await form(request)).get("dry_run") == "false":
        found = await kafka_producer(admin)
        if isinstance(found, web.Response):
            return redirect(_with(admin, "/quarantine", "refused", "Kafka is not reachable, nothing was done"))
        producer = found
    actor = admin.actor(request)
    return await _bulk(request, "quarantine", "/quarantine", lambda conn, f, dry: bulk.redrive_quarantined(
        conn, producer, admin.names, f, int(time.time() * 1000), actor, dry))


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/", overview)
    r.add_get("/resources", resources)
    r.add_post(f"/resources/{{gateway}}/{{resource_id:{ID}}}/fetch", fetch, name="console.fetch")
    r.add_get(f"/resources/{{gateway}}/{{resource_id:{ID}}}", resource)
    r.add_get("/parked", parked)
    r.add_get("/gaps", gaps)
    r.add_get("/quarantine", quarantine_list)
    r.add_post("/quarantine/redrive", redrive_bulk, name="console.redrive.bulk")
    r.add_post(f"/quarantine/{{delivery_id:{ID}}}/redrive", redrive, name="console.redrive")
    r.add_get(f"/quarantine/{{delivery_id:{ID}}}", quarantine_one)
    r.add_get("/effects", effects)
    r.add_post("/effects/retry", retry_bulk, name="console.retry.bulk")
    r.add_post(f"/effects/{{dedupe_key:{ID}}}/retry", retry, name="console.retry")
    r.add_get("/audit", audit)
    r.add_static("/static", HERE / "static", show_index=False)
