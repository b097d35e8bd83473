"""The ingest process: store-then-acknowledge HTTP front door (I/O shell around the adapters).

A 2xx means Kafka acknowledged the append with acks=all from an idempotent producer. Between
receipt and append there is only the size check, the signature check and the resource key.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import time
import uuid
from typing import Any

import asyncpg
import orjson
from aiohttp import web
from aiokafka.errors import KafkaError

from app import timeline
from app.gateways import ADAPTERS, card
from app.gateways.base import Route, SignatureError
from app.metrics import IngestMetrics
from app.producer import KeyedProducer
from app.settings import Settings
from projections.migrate import quote_ident
from topics.catalog import names
from topics.records import H_REASON, Correlation, correlation_headers, raw_headers

log = logging.getLogger("orderly.ingest")

MAX_BODY = 1024 * 1024  # 1 MiB; larger bodies are refused before any HMAC work
CORRELATION_FIELDS = ("merchant_reference", "our_order_id", "our_user_id")

SETTINGS: web.AppKey[Settings] = web.AppKey("settings", Settings)
APPENDER: web.AppKey[Appender] = web.AppKey("appender")
CORRELATIONS: web.AppKey[CorrelationStore] = web.AppKey("correlations")
METRICS: web.AppKey[IngestMetrics] = web.AppKey("metrics", IngestMetrics)


# Delivery ids: a random 64-bit prefix per process and a counter. Unique across processes and
# restarts without a syscall per request (uuid4 reads os.urandom every time).
_ID_PREFIX = uuid.uuid4().hex[:16]
_id_counter = itertools.count()


def next_delivery_id() -> str:
    return f"{_ID_PREFIX}{next(_id_counter):012x}"


class Unavailable(Exception):
    """Kafka (or PostgreSQL) could not take the write in time: answer 503 so the sender retries."""


class Appender:
    """An idempotent acks=all producer shared by every request, so concurrent appends batch."""

    def __init__(self, bootstrap: str, timeout_s: float, metrics: IngestMetrics) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.metrics = metrics
        self._producer: KeyedProducer | None = None
        self._starting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._starting = asyncio.create_task(self._keep_trying_to_start())

    async def _keep_trying_to_start(self) -> None:
        # The ingest comes up even when Kafka is down; until the producer starts it answers 503.
        delay = 0.2
        while self._producer is None:
            producer = KeyedProducer(self.bootstrap, request_timeout_ms=max(1000, int(self.timeout_s * 1000)))
            try:
                await producer.start()
            except KafkaError as exc:
                log.warning("kafka not reachable yet (%s); retrying in %.1fs", exc, delay)
                await producer.stop()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._producer = producer

    async def stop(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
        if self._producer is not None:
            await self._producer.stop()

    async def append(self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                if self._producer is None and self._starting is not None:
                    await asyncio.shield(self._starting)  # still connecting: wait within the deadline
                if self._producer is None:
                    raise Unavailable("kafka producer not connected")
                await self._producer.send_and_wait(topic, key, value, headers)
        except (TimeoutError, KafkaError) as exc:
            self.metrics.append_failures.labels(topic).inc()
            raise Unavailable(f"kafka append failed: {type(exc).__name__}") from exc
        self.metrics.child(self.metrics.append_seconds, topic).observe(time.perf_counter() - started)

    async def kafka_ready(self, topic: str) -> bool:
        producer = self._producer
        if producer is None:
            return False
        try:
            async with asyncio.timeout(2):
                return bool(await producer.producer.partitions_for(topic))
        except (TimeoutError, KafkaError):
            return False


class CorrelationStore:
    """Decides 200/409 for correlation PUTs atomically in PostgreSQL (unique on both ids)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._pool: asyncpg.Pool | None = None

    async def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            try:
                self._pool = await asyncpg.create_pool(
                    self.dsn, min_size=1, max_size=4, timeout=3,
                    server_settings={"search_path": quote_ident(self.schema)})
            except (OSError, asyncpg.PostgresError) as exc:
                raise Unavailable(f"postgres unreachable: {exc}") from exc
        return self._pool

    async def claim(self, c: Correlation) -> bool:
        """True if the mapping is new or identical; False if it conflicts with a stored one."""
        pool = await self.pool()
        try:
            async with pool.acquire() as conn:
                inserted = await conn.fetchval(
                    """INSERT INTO pg_deposit_correlations
                         (pg_deposit_id, merchant_reference, our_order_id, our_user_id)
                       VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1""",
                    c.pg_deposit_id, c.merchant_reference, c.our_order_id, c.our_user_id)
                if inserted:
                    return True
                row = await conn.fetchrow(
                    "SELECT * FROM pg_deposit_correlations WHERE pg_deposit_id = $1", c.pg_deposit_id)
        except (OSError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError) as exc:
            raise Unavailable(f"postgres unavailable: {exc}") from exc
        # No row for this deposit means the merchant_reference belongs to another deposit.
        return row is not None and Correlation(**dict(row)) == c

    async def ready(self) -> bool:
        try:
            pool = await self.pool()
            async with asyncio.timeout(2):
                return bool(await pool.fetchval("SELECT 1") == 1)
        except (Unavailable, TimeoutError, OSError, asyncpg.PostgresError):
            return False

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()


def _json(code: int, **body: Any) -> web.Response:
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


async def receive_webhook(request: web.Request) -> web.Response:
    gateway = request.match_info["gateway"]
    metrics = request.app[METRICS]
    adapter = ADAPTERS.get(gateway)
    if adapter is None:
        metrics.requests.labels("unknown", "not_found").inc()
        return _json(404, error=f"unknown gateway {gateway!r}")
    if request.content_length is not None and request.content_length > MAX_BODY:
        metrics.requests.labels(gateway, "too_large").inc()
        return _json(413, error="body over 1 MiB")
    try:
        raw = await request.read()  # aiohttp enforces client_max_size on chunked bodies too
    except web.HTTPRequestEntityTooLarge:
        metrics.requests.labels(gateway, "too_large").inc()
        return _json(413, error="body over 1 MiB")

    settings = request.app[SETTINGS]
    try:
        adapter.verify(raw, request.headers, settings.secrets[gateway], time.time())
    except SignatureError as exc:
        metrics.requests.labels(gateway, "unauthorized").inc()
        metrics.signature_failures.labels(gateway).inc()
        return _json(401, error=exc.reason)

    route: Route = adapter.route(raw)
    delivery_id = next_delivery_id()
    headers = raw_headers(gateway, delivery_id, int(time.time() * 1000))
    topics = names(settings.namespace)
    try:
        if route.resource_key is None:
            reason = route.quarantine_reason or "unroutable"
            await request.app[APPENDER].append(
                topics.quarantine, delivery_id.encode(), raw, [*headers, (H_REASON, reason.encode())])
            metrics.requests.labels(gateway, "quarantined").inc()
            metrics.quarantined.labels(gateway, route.quarantine_code or "unroutable").inc()
            # 200: the gateway must not retry a body it will never make valid.
            return _json(200, status="stored", quarantined=True, reason=reason, delivery_id=delivery_id)
        await request.app[APPENDER].append(topics.raw, route.resource_key.encode(), raw, headers)
    except Unavailable as exc:
        metrics.requests.labels(gateway, "unavailable").inc()
        return _json(503, error=str(exc))
    metrics.child(metrics.requests, gateway, "stored").inc()
    return _json(200, status="stored", delivery_id=delivery_id)


async def put_correlation(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    settings = request.app[SETTINGS]
    offered = request.headers.get("Authorization", "")
    if not hmac.compare_digest(offered.encode(), f"Bearer {settings.api_token}".encode()):
        metrics.requests.labels("correlations", "unauthorized").inc()
        return _json(401, error="missing or wrong bearer token")
    deposit_id = request.match_info["deposit_id"]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        metrics.requests.labels("correlations", "bad_request").inc()
        return _json(400, error="body must be a JSON object")
    bad = [f for f in CORRELATION_FIELDS if not isinstance(body.get(f), str) or not body[f]]
    if bad:
        metrics.requests.labels("correlations", "bad_request").inc()
        return _json(400, error=f"missing or empty string fields: {', '.join(bad)}")
    correlation = Correlation(deposit_id, *(body[f] for f in CORRELATION_FIELDS))
    try:
        if not await request.app[CORRELATIONS].claim(correlation):
            metrics.requests.labels("correlations", "conflict").inc()
            return _json(409, error="a different mapping is already stored for this deposit or reference")
        # Into orderly.raw under the deposit's key: its webhooks and its correlation then have one
        # order, the log's, live and in replay (DESIGN.md §4). Appended again on an identical PUT:
        # a retry after a 503 must still reach the log (the worker calls the repeat a duplicate).
        await request.app[APPENDER].append(
            names(settings.namespace).raw, f"pg:{deposit_id}".encode(), correlation.to_bytes(),
            correlation_headers(next_delivery_id(), int(time.time() * 1000)))
    except Unavailable as exc:
        metrics.requests.labels("correlations", "unavailable").inc()
        return _json(503, error=str(exc))
    metrics.requests.labels("correlations", "stored").inc()
    return _json(200, status="stored")


async def get_resource(request: web.Request) -> web.Response:
    gateway, resource_id = request.match_info["gateway"], request.match_info["resource_id"]
    if gateway not in ADAPTERS:
        return _json(404, error=f"unknown gateway {gateway!r}")
    try:
        body = await timeline.resource(await request.app[CORRELATIONS].pool(), gateway, resource_id)
    except (Unavailable, OSError, asyncpg.PostgresConnectionError) as exc:
        return _json(503, error=f"postgres unavailable: {exc}")
    if body is None:
        return _json(404, error=f"no deliveries and no state for {gateway}:{resource_id}")
    return web.Response(body=timeline.dumps(body), content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    return _json(200, status="ok")


async def readyz(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    kafka, postgres = await asyncio.gather(
        request.app[APPENDER].kafka_ready(names(settings.namespace).raw),
        request.app[CORRELATIONS].ready(),
    )
    return _json(200 if kafka and postgres else 503, kafka=kafka, postgres=postgres)


async def metrics_endpoint(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": content_type})


def validate_secrets(settings: Settings) -> None:
    """Refuse to start with a card secret that is not a Standard Webhooks key."""
    for secret in settings.secrets["card"]:
        card.secret_key(secret)


def create_app(settings: Settings) -> web.Application:
    validate_secrets(settings)
    app = web.Application(client_max_size=MAX_BODY)
    metrics = IngestMetrics()
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[APPENDER] = Appender(settings.kafka_bootstrap, settings.append_timeout_s, metrics)
    app[CORRELATIONS] = CorrelationStore(settings.postgres_dsn, settings.namespace)
    app.router.add_post("/webhooks/{gateway}", receive_webhook)
    app.router.add_put("/correlations/pg/deposits/{deposit_id}", put_correlation)
    app.router.add_get("/resources/{gateway}/{resource_id}", get_resource)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)

    async def lifecycle(app: web.Application) -> Any:
        await app[APPENDER].start()
        yield
        await app[APPENDER].stop()
        await app[CORRELATIONS].close()

    app.cleanup_ctx.append(lifecycle)
    return app


def run(settings: Settings) -> None:
    web.run_app(create_app(settings), host=settings.ingest_host, port=settings.ingest_port,
                access_log=None, print=lambda msg: log.info(msg))
