"""`orderly admin`: the admin API and the console on their own port (I/O shell; DESIGN.md §3.1).

Never on the webhook port. Every route needs ``ORDERLY_ADMIN_TOKEN`` (app/admin/auth.py): without
it ``/api/*`` answers 401 JSON and a page redirects to ``/login``. Reads go through
app/admin/queries.py, actions through app/admin/actions.py (each one audited), the same functions
the operator commands call. The console's pages are app/admin/console.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import asyncpg
from aiohttp import web
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from app.admin import actions, auth, queries
from app.admin.openapi import document
from app.gateways import registry
from app.gateways.limits import id_error
from app.kafka_client import client_options
from app.metrics import AdminMetrics
from app.producer import KeyedProducer
from app.settings import Settings, SettingsError
from projections.bulk import Conn
from projections.migrate import quote_ident
from topics.catalog import TopicNames, names

log = logging.getLogger("orderly.admin")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
KAFKA_DEADLINE_S = 2.0
LAG_INTERVAL_S = 15.0
POSTGRES_DEADLINE_S = 10.0  # a query, or the wait for a pooled connection: past it, 503
BODY_DEADLINE_S = 10.0  # a form body that has not arrived by then: 408
ACTIONS_AT_ONCE = 2  # actions may wait on Kafka holding a connection: the rest of the pool serves reads


class Admin:
    """What the handlers share: settings, the PostgreSQL pool, Kafka (reached lazily, so the
    admin serves PostgreSQL's view while Kafka is away), metrics and the login throttle."""

    @staticmethod
    def check(settings: Settings) -> str:
        """The admin token; none (or a blank one) stops the process before it serves anything."""
        if not settings.admin_token or not settings.admin_token.reveal().strip():
            raise SettingsError("ORDERLY_ADMIN_TOKEN is not set: the admin API and console refuse to run "
                                "without their own token")
        return settings.admin_token.reveal()

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.token: str = self.check(settings)
        self.names: TopicNames = names(settings.namespace)
        self.metrics = AdminMetrics()
        self.throttle = auth.LoginThrottle()
        self.pool: asyncpg.Pool | None = None
        self.acting = asyncio.Semaphore(ACTIONS_AT_ONCE)
        self._producer: KeyedProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._kafka_admin: AIOKafkaAdminClient | None = None
        self._lag_task: asyncio.Task[None] | None = None
        self.lag: dict[str, Any] = {"groups": [], "error": "not measured yet"}

    async def start(self) -> None:
        self.pool = await asyncpg.create_pool(
            self.settings.postgres_dsn.reveal(), min_size=1, max_size=ACTIONS_AT_ONCE + 4, timeout=POSTGRES_DEADLINE_S,
            command_timeout=POSTGRES_DEADLINE_S, server_settings={"search_path": quote_ident(self.settings.namespace)})
        self._lag_task = asyncio.create_task(self._measure_lag_forever())

    async def stop(self) -> None:
        if self._lag_task is not None:
            self._lag_task.cancel()
        for closing in (self._producer.stop() if self._producer else None,
                        self._consumer.stop() if self._consumer else None,
                        self._kafka_admin.close() if self._kafka_admin else None):
            if closing is not None:
                try:
                    await asyncio.wait_for(closing, 5)
                except Exception as exc:  # stopping: what failed to close is only logged
                    log.info("closing a Kafka client: %r", exc)
        if self.pool is not None:
            await self.pool.close()

    def db(self) -> Pooled:
        """A pooled connection, waited for at most POSTGRES_DEADLINE_S (a stopped PostgreSQL, or a
        pool taken by slow queries, answers 503 instead of holding the request)."""
        assert self.pool is not None
        return Pooled(self.pool)

    async def producer(self) -> KeyedProducer:
        if self._producer is None:
            producer = KeyedProducer(self.settings.kafka_bootstrap, request_timeout_ms=10_000,
                                     **client_options(self.settings))
            await asyncio.wait_for(producer.start(), 10)
            self._producer = producer
        return self._producer

    async def _measure_lag_forever(self) -> None:
        while True:
            try:
                self.lag = await asyncio.wait_for(self.measure_lag(), 10)
            except Exception as exc:  # Kafka away: the overview says so, the loop tries again
                self.lag = {"groups": self.lag.get("groups", []), "error": f"{type(exc).__name__}: {exc}"[:300]}
                await self._close_lag_clients()  # not reconnecting in the background: one try per interval
            await asyncio.sleep(LAG_INTERVAL_S)

    async def _close_lag_clients(self) -> None:
        consumer, kafka_admin, self._consumer, self._kafka_admin = self._consumer, self._kafka_admin, None, None
        for closing in (consumer.stop() if consumer else None, kafka_admin.close() if kafka_admin else None):
            if closing is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(closing, 5)

    async def measure_lag(self) -> dict[str, Any]:
        """Per consumer group and topic: records appended but not consumed yet. The worker and the
        fetcher commit to Kafka; the projector and effects recorder keep positions in PostgreSQL."""
        if self._consumer is None or self._kafka_admin is None:
            # kept only once both started: a failed start leaves nothing half-started behind
            consumer = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka_bootstrap, enable_auto_commit=False,
                                        **client_options(self.settings))
            kafka_admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap,
                                              **client_options(self.settings))
            try:
                await consumer.start()
                await kafka_admin.start()
            except BaseException:
                for closing in (consumer.stop(), kafka_admin.close()):
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(closing, 5)
                raise
            self._consumer, self._kafka_admin = consumer, kafka_admin
        assert self._kafka_admin is not None
        n, ns = self.names, self.settings.namespace
        async with self.db() as conn:
            stored = await queries.sink_positions(conn)
        sinks: dict[tuple[str, str], dict[int, int]] = {}
        for consumer_name, topic, partition, offset in stored:
            sinks.setdefault((consumer_name, topic), {})[partition] = offset
        kafka_groups = {f"{ns}-worker": n.raw, f"{ns}-fetcher": n.fetch}
        topics = set(kafka_groups.values()) | {topic for _, topic in sinks}
        await self._consumer.topics()  # fresh metadata: the partitions of every topic
        tps = [TopicPartition(t, p) for t in sorted(topics)
               for p in sorted(self._consumer.partitions_for_topic(t) or ())]
        ends = await self._consumer.end_offsets(tps)
        groups = []
        for group, topic in kafka_groups.items():
            mine = [tp for tp in tps if tp.topic == topic]
            committed = await self._kafka_admin.list_consumer_group_offsets(group, partitions=mine)
            lag = sum(ends[tp] - max(committed[tp].offset, 0) if tp in committed else ends[tp] for tp in mine)
            groups.append({"group": group, "topic": topic, "lag": lag, "store": "kafka"})
        for (consumer_name, topic), positions in sorted(sinks.items()):
            lag = sum(ends[tp] - positions.get(tp.partition, 0) for tp in tps if tp.topic == topic)
            groups.append({"group": consumer_name, "topic": topic, "lag": max(lag, 0), "store": "postgresql"})
        for g in groups:
            self.metrics.consumer_lag.labels(g["group"], g["topic"]).set(g["lag"])
        return {"groups": groups, "error": None, "measured_at": time.time()}

    def fetch_api(self, gateway: str) -> str | None:
        """The gateway API the fetcher asks for this gateway's resources, as configured here."""
        return {"card": self.settings.card_api_url, "pg": self.settings.pg_api_url}.get(gateway)

    async def session_ended(self, cookie: str) -> bool:
        async with self.db() as conn:
            return bool(await conn.fetchval(ENDED, auth.session_name(cookie)))

    def actor(self, request: web.Request) -> str:
        via = request.get(VIA, "api")
        who = request.remote or "?"
        return f"{via}@{who}"


ENDED = "SELECT EXISTS (SELECT 1 FROM admin_ended_sessions WHERE nonce = $1)"
END_SESSION = "INSERT INTO admin_ended_sessions (nonce) VALUES ($1) ON CONFLICT DO NOTHING"


class Pooled:
    """``async with admin.db() as conn``: a connection from the pool within the deadline."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.conn: Any = None

    async def __aenter__(self) -> Any:
        self.conn = await self.pool.acquire(timeout=POSTGRES_DEADLINE_S)
        return self.conn

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.release(self.conn)


ADMIN: web.AppKey[Admin] = web.AppKey("admin", Admin)
VIA = web.RequestKey("via", str)  # who asks: "api" or "console:<session>"
SESSION = web.RequestKey("session", str)  # the console's session cookie, when signed in


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=queries.dumps(body), status=status, content_type="application/json")


def problem(status: int, error: str) -> web.Response:
    return json_response({"error": error}, status)


def redirect(location: str) -> web.Response:
    """303 See Other, returned (aiohttp deprecates returning its HTTP exceptions as responses)."""
    return web.Response(status=303, headers={"Location": location})


class Refused(Exception):
    """A request the API refuses with a reason (a bad parameter): answered ``problem(status, error)``."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status, self.error = status, error


def _answer(request: web.Request, exc: web.HTTPException) -> web.Response:
    """What the router raised (404, 405) or a handler raised as an aiohttp exception, as a plain
    response: a problem document under /api/, the exception's own text elsewhere."""
    if request.path.startswith("/api/") and exc.status >= 400:
        response = problem(exc.status, exc.reason)
    else:
        response = web.Response(status=exc.status, reason=exc.reason, text=exc.text)
    for name in ("Allow", "Location"):
        if name in exc.headers:
            response.headers[name] = exc.headers[name]
    return response


# --- auth and housekeeping -------------------------------------------------------------------

# The API document and /metrics hold no resource data; the admin port is never internet-facing.
PUBLIC = {"/login", "/openapi.json", "/static/console.css", "/static/console.js", "/healthz", "/metrics"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authentication, CSRF, security headers, metrics, and never a traceback to the client."""
    admin = request.app[ADMIN]
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    try:
        response = await _authorised(request, handler, admin)
    except web.HTTPException as exc:
        response = _answer(request, exc)
    except Refused as exc:
        response = (problem(exc.status, exc.error) if request.path.startswith("/api/")
                    else web.Response(status=exc.status, text=exc.error))
    except asyncpg.DataError as exc:  # a value PostgreSQL cannot take (out of range): the input's fault
        text = f"a value PostgreSQL cannot take: {type(exc).__name__}"
        response = problem(400, text) if request.path.startswith("/api/") else web.Response(status=400, text=text)
    except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError, TimeoutError) as exc:
        log.warning("admin request %s %s: PostgreSQL unavailable: %r", request.method, request.path, exc)
        text = f"PostgreSQL unavailable: {type(exc).__name__}"
        response = problem(503, text) if request.path.startswith("/api/") else web.Response(status=503, text=text)
    except Exception:
        log.exception("admin request %s %s failed", request.method, request.path)
        response = (problem(500, "internal error; see the admin process's log") if request.path.startswith("/api/")
                    else web.Response(status=500, text="internal error; see the admin process's log"))
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    admin.metrics.requests.labels(route, str(response.status)).inc()
    return response


async def _authorised(request: web.Request, handler: Handler, admin: Admin) -> web.StreamResponse:
    if request.path in PUBLIC:
        return await handler(request)
    api = request.path.startswith("/api/")
    header = request.headers.get("Authorization")
    if header is not None and header.startswith("Bearer "):
        who, now = request.remote or "?", time.monotonic()
        if not admin.throttle.allowed(who, now):
            return problem(429, "too many wrong tokens from this address; wait a minute")
        if auth.bearer_ok(admin.token, header):
            request[VIA] = "api"
            return await handler(request)
        admin.throttle.failed(who, now)
    cookie = request.cookies.get(auth.SESSION_COOKIE)
    if cookie and auth.session_ok(admin.token, cookie) and not await admin.session_ended(cookie):
        request[VIA] = f"console:{auth.session_name(cookie)}"
        request[SESSION] = cookie
        if request.method == "POST":
            given = request.headers.get("X-CSRF-Token")
            if given is None and request.content_type == "application/x-www-form-urlencoded":
                given = str((await form(request)).get("csrf", ""))
            if not auth.csrf_ok(admin.token, cookie, given):
                return (problem(403, "missing or wrong CSRF token") if api
                        else web.Response(status=403, text="missing or wrong CSRF token: reload the page"))
        return await handler(request)
    if api:
        admin.metrics.login_failures.labels("api").inc()
        return problem(401, "Authorization: Bearer ORDERLY_ADMIN_TOKEN required")
    if request.method != "GET":
        return web.Response(status=401, text="sign in first")
    return redirect(f"/login?next={_quote(request.path_qs)}")


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


async def form(request: web.Request) -> Any:
    """The request's form, arrived within BODY_DEADLINE_S (a body that trickles in gets 408)."""
    try:
        return await asyncio.wait_for(request.post(), BODY_DEADLINE_S)
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


# --- the API ------------------------------------------------------------------------------

def _limit(request: web.Request, default: int = 50, most: int = 500) -> int:
    raw = request.query.get("limit")
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= most:
        raise Refused(400, f"limit must be an integer from 1 to {most}")
    return int(raw)


def text_param(request: web.Request, name: str, most: int = 200) -> str | None:
    """A free-text query parameter: None when absent, refused when PostgreSQL's text cannot hold it."""
    value = request.query.get(name) or None
    if value is not None and ("\x00" in value or len(value) > most):
        raise Refused(400, f"{name} must be at most {most} characters without NUL")
    return value


def path_id(request: web.Request, name: str) -> str:
    """An id from the path, within the ingest's limits for ids (so a NUL or 6,000 characters get
    400 here, not a database error)."""
    value = request.match_info[name]
    if error := id_error(name, value):
        raise Refused(400, error)
    return value


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
    async with admin.db() as conn:
        counts = await queries.overview(conn)
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
    async with request.app[ADMIN].db() as conn:
        body = await queries.resource(conn, gateway, resource_id)
    return json_response(body) if body is not None else problem(404, f"no {gateway} resource {resource_id!r}")


async def api_search(request: web.Request) -> web.Response:
    q = request.query
    try:
        async with request.app[ADMIN].db() as conn:
            found = await queries.search(conn, _gateway(q.get("gateway")), text_param(request, "status"),
                                         text_param(request, "q"), _limit(request),
                                         text_param(request, "cursor", 2000))
    except queries.BadCursor as exc:
        return problem(400, str(exc))
    return json_response(found)


async def api_parked(request: web.Request) -> web.Response:
    async with request.app[ADMIN].db() as conn:
        return json_response({"items": await queries.parked(conn, _limit(request, 200))})


async def api_gaps(request: web.Request) -> web.Response:
    async with request.app[ADMIN].db() as conn:
        return json_response({"items": await queries.gaps(conn, _limit(request, 200))})


async def api_quarantine(request: web.Request) -> web.Response:
    from projections import quarantine

    stage = text_param(request, "stage")
    async with request.app[ADMIN].db() as conn:
        rows = await quarantine.listing(conn, stage, _gateway(request.query.get("gateway")), _limit(request))
    return json_response({"items": rows})


async def api_quarantined(request: web.Request) -> web.Response:
    from projections import quarantine

    delivery_id = path_id(request, "delivery_id")
    async with request.app[ADMIN].db() as conn:
        found = await quarantine.one(conn, delivery_id)
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


async def _kafka_producer(admin: Admin) -> KeyedProducer | web.Response:
    try:
        return await admin.producer()
    except Exception as exc:  # Kafka away: nothing was done, say so
        return problem(503, f"Kafka is not reachable, nothing was done: {type(exc).__name__}")


async def api_redrive(request: web.Request) -> web.Response:
    admin = request.app[ADMIN]
    producer = await _kafka_producer(admin)
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


async def api_fetch(request: web.Request) -> web.Response:
    admin = request.app[ADMIN]
    gateway, resource_id = request.match_info["gateway"], request.match_info["resource_id"]
    if registry.find(gateway) is None:
        return problem(404, f"unknown gateway {gateway!r}")
    producer = await _kafka_producer(admin)
    if isinstance(producer, web.Response):
        return producer
    return await _act(request, lambda conn: actions.request_fetch(
        conn, producer, admin.names, gateway, resource_id, admin.actor(request), admin.fetch_api(gateway)))


async def api_audit(request: web.Request) -> web.Response:
    async with request.app[ADMIN].db() as conn:
        return json_response({"items": await queries.audit_log(conn, _limit(request))})


async def openapi(request: web.Request) -> web.Response:
    return json_response(document())


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def metrics_endpoint(request: web.Request) -> web.Response:
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    return web.Response(body=generate_latest(request.app[ADMIN].metrics.registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


ID = r".+"  # resource ids, delivery ids and dedupe keys may hold '/', ':' and braces


def create_app(settings: Settings) -> web.Application:
    from app.admin import console

    app = web.Application(middlewares=[guard], client_max_size=64 * 1024)
    admin = Admin(settings)
    app[ADMIN] = admin
    r = app.router
    r.add_get("/api/overview", api_overview)
    r.add_get("/api/resources", api_search)
    r.add_post(f"/api/resources/{{gateway}}/{{resource_id:{ID}}}/fetch", api_fetch, name="resources.fetch")
    r.add_get(f"/api/resources/{{gateway}}/{{resource_id:{ID}}}", api_resource)
    r.add_get("/api/parked", api_parked)
    r.add_get("/api/gaps", api_gaps)
    r.add_get("/api/quarantine", api_quarantine)
    r.add_post(f"/api/quarantine/{{delivery_id:{ID}}}/redrive", api_redrive, name="quarantine.redrive")
    r.add_get(f"/api/quarantine/{{delivery_id:{ID}}}", api_quarantined)
    r.add_get("/api/effects", api_effects)
    r.add_post(f"/api/effects/{{dedupe_key:{ID}}}/retry", api_retry, name="effects.retry")
    r.add_get("/api/audit", api_audit)
    r.add_get("/openapi.json", openapi)
    r.add_get("/healthz", healthz)
    r.add_get("/metrics", metrics_endpoint)
    console.add_routes(app)

    async def lifecycle(app: web.Application) -> Any:
        await admin.start()
        yield
        await admin.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


def run(settings: Settings) -> None:
    app = create_app(settings)
    log.info("admin API and console on http://%s:%d", settings.admin_host, settings.admin_port)
    web.run_app(app, host=settings.admin_host, port=settings.admin_port, access_log=None, print=None,
                handle_signals=True)
