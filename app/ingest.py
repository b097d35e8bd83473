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
from collections.abc import Awaitable, Mapping
from typing import Any

import asyncpg
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest

from app.deadlines import Deadlines
from app.gateways import card, registry
from app.gateways.base import Route, SignatureError
from app.gateways.limits import id_error
from app.kafka_client import client_options
from app.logs import SampledLog, bound
from app.metrics import IngestMetrics, serve_metrics
from app.producer import KeyedProducer
from app.settings import Settings
from app.webhook_http import WebhookSite
from projections.migrate import quote_ident
from topics.catalog import TopicNames, names
from topics.records import H_CHECKED, Correlation, correlation_headers, quarantine_headers, raw_headers

log = logging.getLogger("orderly.ingest")

MAX_BODY = 1024 * 1024  # 1 MiB; larger bodies are refused before any HMAC work
# A correlation is three ids of at most 200 characters: 64 KiB is room for any JSON spelling of
# them, and a bound on what one PUT makes the ingest hold in memory.
MAX_CORRELATION_BODY = 64 * 1024
CORRELATION_FIELDS = ("merchant_reference", "our_order_id", "our_user_id")
READY_DEADLINE_S = 2.0  # DESIGN.md §3: readiness is Kafka and PostgreSQL answering now, within 2 s

SETTINGS: web.AppKey[Settings] = web.AppKey("settings", Settings)
APPENDER: web.AppKey[Appender] = web.AppKey("appender")
CORRELATIONS: web.AppKey[CorrelationStore] = web.AppKey("correlations")
METRICS: web.AppKey[IngestMetrics] = web.AppKey("metrics", IngestMetrics)
REFUSALS: web.AppKey[SampledLog] = web.AppKey("refusals", SampledLog)
TOPICS: web.AppKey[TopicNames] = web.AppKey("topics", TopicNames)
RECEIVER: web.AppKey[Receiver] = web.AppKey("receiver")
# 401s, quarantined bodies and 503s are logged with their reason, at most this many lines per gateway
# and reason a minute (then one line with the count of the rest): a flood cannot fill the disk.
REFUSALS_LOGGED_PER_MINUTE = 5


# Delivery ids: a random 64-bit prefix per process and a counter. Unique across processes and
# restarts without a syscall per request (uuid4 reads os.urandom every time).
_ID_PREFIX = uuid.uuid4().hex[:16]
_id_counter = itertools.count()


CHECKED = (H_CHECKED, b"1")  # the body passed its adapter's typed schema here


def next_delivery_id() -> str:
    return f"{_ID_PREFIX}{next(_id_counter):012x}"


class Unavailable(Exception):
    """Kafka (or PostgreSQL) could not take the write in time: answer 503 so the sender retries."""


class BodyRefused(Exception):
    """The request body cannot be taken: too large (413), not arrived in time (408), malformed (400)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, at most ``limit`` bytes, arrived within ``timeout_s``; else BodyRefused.

    A sender that announces a longer Content-Length than it sends (or stops mid-chunk) would
    otherwise hold its socket and a handler for ever, so the wait has a deadline.
    """
    too_large = BodyRefused(413, f"body over {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large  # before reading a byte of it
    content = request.content
    chunks: list[bytes] = []
    size = 0
    try:
        if content.is_eof():  # the whole body came with the headers (the usual case): nothing to wait for
            whole = content.read_nowait()
            if len(whole) > limit:
                raise too_large
            return whole
        async with asyncio.timeout(timeout_s):
            while chunk := await content.readany():
                size += len(chunk)
                if size > limit:  # a chunked body announces no length
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise BodyRefused(408, f"the body did not arrive within {timeout_s:g} s") from None
    except HttpProcessingError as exc:  # e.g. a malformed chunk
        raise BodyRefused(400, f"malformed body: {exc.message}") from None
    except ConnectionError:
        raise BodyRefused(400, "the connection closed before the body arrived") from None
    return b"".join(chunks)


async def refuse_body(request: web.Request, refused: BodyRefused) -> web.StreamResponse:
    """Answer a refused body and close the connection: the rest of the body may never come, and
    waiting to drain it (aiohttp lingers up to 10 s) would keep the socket the timeout freed."""
    resp = _json(refused.status, error=refused.reason)
    resp.force_close()
    if refused.status == 408:
        await resp.prepare(request)
        await resp.write_eof()
        request.protocol.force_close()  # after the answer is written: the transport flushes it first
    return resp


class NoAnswer(Exception):
    """A readiness probe did not complete within its deadline."""


async def answer_within(check: Awaitable[None], deadline_s: float) -> BaseException | None:
    """None if ``check`` completed within ``deadline_s``, else what went wrong. Waits no longer
    than the deadline even for a check that does not honour cancellation promptly."""
    task = asyncio.ensure_future(check)
    done, _ = await asyncio.wait({task}, timeout=deadline_s)
    if not done:
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # nobody awaits it any more
        return NoAnswer(f"no answer within {deadline_s:g} s")
    return task.exception()


def public_reason(exc: BaseException) -> str:
    """What /readyz says on the internet-facing port: our own messages, otherwise only the error's
    type (an exception's text may carry internal addresses; the log has it in full)."""
    cause = exc.__cause__
    if isinstance(exc, (NoAnswer, Unavailable)) and cause is None:
        return str(exc)
    return type(cause or exc).__name__


class Appender:
    """An idempotent acks=all producer shared by every request, so concurrent appends batch."""

    def __init__(self, bootstrap: str, timeout_s: float, metrics: IngestMetrics, **client: Any) -> None:
        self.bootstrap = bootstrap
        self.client = client  # how to reach Kafka (app/kafka_client.py)
        self.timeout_s = timeout_s
        self.metrics = metrics
        self._producer: KeyedProducer | None = None
        self._starting: asyncio.Task[None] | None = None
        self.deadlines = Deadlines(timeout_s)
        self._expiring: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._starting = asyncio.create_task(self._keep_trying_to_start())
        self._expiring = asyncio.create_task(self.deadlines.run())

    async def _keep_trying_to_start(self) -> None:
        # The ingest comes up even when Kafka is down; until the producer starts it answers 503.
        delay = 0.2
        while self._producer is None:
            # No linger: under load the requests waiting while one produce request is in flight
            # make the next one's batch anyway. A 2 ms linger woke the sender to re-check lingering
            # batches on every append: measured side by side over 6 rounds, it cost the ingest 6-10 % more
            # CPU and the pipeline 0-15 % (median 10 %) of its webhooks/s (docs/benchmarks.md).
            producer = KeyedProducer(self.bootstrap, linger_ms=0,
                                     request_timeout_ms=max(1000, int(self.timeout_s * 1000)), **self.client)
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
        if self._expiring is not None:
            self._expiring.cancel()
        if self._producer is not None:
            await self._producer.stop()

    async def append(self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        started = time.perf_counter()
        producer = self._producer
        try:
            if producer is None or self._expiring is None or self._expiring.done():
                async with asyncio.timeout(self.timeout_s):
                    if self._producer is None and self._starting is not None:
                        await asyncio.shield(self._starting)  # still connecting: wait within the deadline
                    if self._producer is None:
                        raise Unavailable("kafka producer not connected")
                    await self._producer.send_and_wait(topic, key, value, headers)
            else:
                # Handing the record over waits only when aiokafka's buffer is full or the topic's
                # metadata is missing; the whole append waits at most until the deadline, which
                # self.deadlines keeps for every append in flight.
                task = asyncio.current_task()
                pending = self.deadlines.watch(asyncio.get_running_loop().time(), task)
                try:
                    pending.delivered = await producer.send(topic, key, value, headers)
                    await pending.delivered
                except asyncio.CancelledError:
                    if not pending.expired or task is None:
                        raise
                    task.uncancel()  # our own cancellation, as asyncio.timeout does: the deadline passed
                    raise TimeoutError from None
                finally:
                    pending.finished = True
        except (TimeoutError, KafkaError) as exc:
            self.metrics.append_failures.labels(topic).inc()
            raise Unavailable(f"kafka append failed: {type(exc).__name__}") from exc
        self.metrics.child(self.metrics.append_seconds, topic).observe(time.perf_counter() - started)

    async def probe(self, topic: str) -> None:
        """Ask a broker for ``topic``'s metadata now, over the producer's own connections.

        Not ``partitions_for``: that answers from cached metadata, so a stopped broker looked
        ready. Raises Unavailable (or a KafkaError) when no broker answers with the topic.
        """
        producer = self._producer
        if producer is None:
            raise Unavailable("kafka producer not connected")
        client = producer.producer.client
        # allow_auto_topic_creation=False: a probe must never create the topic it asks about
        request = MetadataRequest([topic], allow_auto_topic_creation=False)
        failures = []
        for broker in client.cluster.brokers():
            try:
                response = await client.send(broker.nodeId, request)
            except KafkaError as exc:
                failures.append(f"broker {broker.nodeId}: {type(exc).__name__}")
                continue
            answered = ClusterMetadata()
            answered.update_metadata(response)
            if not answered.partitions_for_topic(topic):
                raise Unavailable(f"kafka has no partitions for {topic}")
            return
        raise Unavailable(f"no kafka broker answered ({'; '.join(failures) or 'none known'})")


class CorrelationStore:
    """Decides 200/409 for correlation PUTs atomically in PostgreSQL (unique on both ids)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._pool: asyncpg.Pool | None = None
        self._creating: asyncio.Future[asyncpg.Pool] | None = None

    async def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            # One creation shared by concurrent first callers (two would each open a pool and leak
            # one), shielded so that a caller's deadline does not cancel it half-way.
            if self._creating is None:
                self._creating = asyncio.ensure_future(self._create_pool())
            creating = self._creating
            try:
                self._pool = await asyncio.shield(creating)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                raise Unavailable(f"postgres unreachable: {exc}") from exc
            finally:
                if creating.done():
                    self._creating = None
        return self._pool

    async def _create_pool(self) -> asyncpg.Pool:
        return await asyncpg.create_pool(
            self.dsn, min_size=1, max_size=4, timeout=3,
            server_settings={"search_path": quote_ident(self.schema)})

    async def claim(self, c: Correlation, timeout_s: float) -> bool:
        """True if the mapping is new or identical; False if it conflicts with a stored one."""
        pool = await self.pool()
        try:
            async with asyncio.timeout(timeout_s), pool.acquire() as conn:
                inserted = await conn.fetchval(
                    """INSERT INTO pg_deposit_correlations
                         (pg_deposit_id, merchant_reference, our_order_id, our_user_id)
                       VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1""",
                    c.pg_deposit_id, c.merchant_reference, c.our_order_id, c.our_user_id)
                if inserted:
                    return True
                row = await conn.fetchrow(
                    "SELECT * FROM pg_deposit_correlations WHERE pg_deposit_id = $1", c.pg_deposit_id)
        except (OSError, TimeoutError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
                asyncpg.InterfaceError) as exc:
            raise Unavailable(f"postgres unavailable: {type(exc).__name__} {exc}") from exc
        # No row for this deposit means the merchant_reference belongs to another deposit.
        return row is not None and Correlation(**dict(row)) == c

    async def probe(self) -> None:
        """SELECT 1 now, on a pooled connection (no new connection per probe)."""
        pool = await self.pool()
        if await pool.fetchval("SELECT 1") != 1:
            raise Unavailable("postgres answered SELECT 1 wrongly")

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()


OUTCOMES = {400: "bad_request", 408: "timeout", 413: "too_large"}


def _json(code: int, **body: Any) -> web.Response:
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


class Receiver:
    """A signed webhook's way from its raw bytes to its answer, whichever HTTP layer read it (aiohttp's,
    or app/webhook_http.py's fast path): signature, route, append, metrics, sampled refusal logs."""

    def __init__(self, settings: Settings, metrics: IngestMetrics, appender: Appender, refusals: SampledLog,
                 topics: TopicNames) -> None:
        self.settings = settings
        self.metrics = metrics
        self.appender = appender
        self.refusals = refusals
        self.topics = topics

    def serves(self, gateway: str) -> bool:
        """A gateway with an adapter and a secret: no secret, no way to prove a body is the gateway's."""
        return registry.find(gateway) is not None and bool(self.settings.secrets.get(gateway))

    async def webhook(self, gateway: str, raw: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        """(status, JSON body) for a body of a gateway this receiver serves."""
        metrics = self.metrics
        found = registry.find(gateway)
        assert found is not None
        try:
            found.adapter.verify(raw, headers, self.settings.secrets[gateway].reveal(), time.time())
        except SignatureError as exc:
            metrics.requests.labels(gateway, "unauthorized").inc()
            metrics.signature_failures.labels(gateway).inc()
            # the reason only: never the headers (they carry the signature) nor the body
            self.refusals.log(logging.WARNING, (gateway, "unauthorized", exc.reason), "401 %s: %s", gateway,
                              exc.reason, extra={"gateway": gateway, "outcome": "unauthorized",
                                                 "reason": exc.reason})
            return 401, orjson.dumps({"error": exc.reason})

        route: Route = found.adapter.route(raw)
        delivery_id = next_delivery_id()
        headers_out = raw_headers(gateway, delivery_id, int(time.time() * 1000))
        try:
            if route.resource_key is None:
                return await self._quarantine(gateway, raw, route, delivery_id, headers_out)
            await self.appender.append(self.topics.raw, route.resource_key.encode(), raw, [*headers_out, CHECKED])
        except Unavailable as exc:
            metrics.requests.labels(gateway, "unavailable").inc()
            self.refusals.log(logging.WARNING, (gateway, "unavailable"), "503 %s: %s", gateway, exc,
                              extra={"gateway": gateway, "outcome": "unavailable", "delivery_id": delivery_id})
            return 503, orjson.dumps({"error": str(exc)})
        metrics.child(metrics.requests, gateway, "stored").inc()
        return 200, orjson.dumps({"status": "stored", "delivery_id": delivery_id})

    async def _quarantine(self, gateway: str, raw: bytes, route: Route, delivery_id: str,
                          headers: list[tuple[str, bytes]]) -> tuple[int, bytes]:
        reason = route.quarantine_reason or "unroutable"
        await self.appender.append(self.topics.quarantine, delivery_id.encode(), raw,
                                   quarantine_headers(headers, "ingest", reason, route.resource_hint))
        self.metrics.requests.labels(gateway, "quarantined").inc()
        code = route.quarantine_code or "unroutable"
        self.metrics.quarantined.labels(gateway, code).inc()
        resource_id = route.resource_hint.split(":", 1)[-1] if route.resource_hint else None
        with bound(gateway=gateway, delivery_id=delivery_id, resource_id=resource_id):
            self.refusals.log(logging.WARNING, (gateway, "quarantined", code), "quarantined %s delivery %s: %s",
                              gateway, delivery_id, reason, extra={"outcome": "quarantined", "code": code,
                                                                   "reason": reason, "event_id": route.event_id})
        # 200: the gateway must not retry a body it will never make valid.
        return 200, orjson.dumps({"status": "stored", "quarantined": True, "reason": reason,
                                  "delivery_id": delivery_id})


async def receive_webhook(request: web.Request) -> web.StreamResponse:
    """aiohttp's way in (every request the fast path hands over: chunked or slow bodies, Expect, ...)."""
    gateway = request.match_info["gateway"]
    receiver = request.app[RECEIVER]
    if not receiver.serves(gateway):
        receiver.metrics.requests.labels("unknown", "not_found").inc()
        return _json(404, error=f"unknown gateway {gateway!r}")
    try:
        raw = await read_body(request, MAX_BODY, receiver.settings.read_timeout_s)
    except BodyRefused as refused:
        receiver.metrics.requests.labels(gateway, OUTCOMES[refused.status]).inc()
        return await refuse_body(request, refused)
    status, body = await receiver.webhook(gateway, raw, request.headers)
    return web.Response(status=status, body=body, content_type="application/json")


def correlation_error(deposit_id: str, body: Any) -> str | None:
    """Why a PUT cannot be a correlation (DESIGN.md §2.4: ids of 1-200 printable characters, no NUL),
    or None. Checked before PostgreSQL, whose index rows and text type refuse such values with a 500."""
    if not isinstance(body, dict):
        return "body must be a JSON object"
    missing = [f for f in CORRELATION_FIELDS if f not in body]
    if missing:
        return f"missing fields: {', '.join(missing)}"
    errors = [id_error("pg_deposit_id", deposit_id), *(id_error(f, body[f]) for f in CORRELATION_FIELDS)]
    return "; ".join(e for e in errors if e) or None


async def put_correlation(request: web.Request) -> web.StreamResponse:
    metrics = request.app[METRICS]
    settings = request.app[SETTINGS]
    # Headers arrive decoded with surrogateescape: a non-UTF-8 byte must compare unequal, not raise.
    offered = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(offered, f"Bearer {settings.api_token.reveal()}".encode()):
        metrics.requests.labels("correlations", "unauthorized").inc()
        return _json(401, error="missing or wrong bearer token")
    deposit_id = request.match_info["deposit_id"]
    try:
        raw = await read_body(request, MAX_CORRELATION_BODY, settings.read_timeout_s)
    except BodyRefused as refused:
        metrics.requests.labels("correlations", OUTCOMES[refused.status]).inc()
        return await refuse_body(request, refused)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    error = correlation_error(deposit_id, body)
    if error:
        metrics.requests.labels("correlations", "bad_request").inc()
        return _json(400, error=error)
    correlation = Correlation(deposit_id, *(body[f] for f in CORRELATION_FIELDS))
    try:
        if not await request.app[CORRELATIONS].claim(correlation, settings.append_timeout_s):
            metrics.requests.labels("correlations", "conflict").inc()
            return _json(409, error="a different mapping is already stored for this deposit or reference")
        # Into orderly.raw under the deposit's key: its webhooks and its correlation then have one
        # order, the log's, live and in replay (DESIGN.md §4). Appended again on an identical PUT:
        # a retry after a 503 must still reach the log (the worker calls the repeat a duplicate).
        await request.app[APPENDER].append(
            request.app[TOPICS].raw, f"pg:{deposit_id}".encode(), correlation.to_bytes(),
            correlation_headers(next_delivery_id(), int(time.time() * 1000)))
    except Unavailable as exc:
        metrics.requests.labels("correlations", "unavailable").inc()
        return _json(503, error=str(exc))
    metrics.requests.labels("correlations", "stored").inc()
    return _json(200, status="stored")


async def healthz(request: web.Request) -> web.Response:
    return _json(200, status="ok")


async def readyz(request: web.Request) -> web.Response:
    """Both answer now, each within READY_DEADLINE_S and concurrently; 503 names what did not."""
    settings = request.app[SETTINGS]
    kafka, postgres = await asyncio.gather(
        answer_within(request.app[APPENDER].probe(names(settings.namespace).raw), READY_DEADLINE_S),
        answer_within(request.app[CORRELATIONS].probe(), READY_DEADLINE_S),
    )
    if kafka is None and postgres is None:
        return _json(200, kafka=True, postgres=True)
    failed = {name: exc for name, exc in (("kafka", kafka), ("postgres", postgres)) if exc is not None}
    for name, exc in failed.items():
        log.warning("not ready: %s: %s: %s", name, type(exc).__name__, exc)
    return _json(503, kafka=kafka is None, postgres=postgres is None,
                 errors={name: public_reason(exc) for name, exc in failed.items()})


def validate_secrets(settings: Settings) -> None:
    """Refuse to start with a card secret that is not a Standard Webhooks key."""
    for secret in settings.secrets["card"].reveal():
        card.secret_key(secret)


def create_app(settings: Settings) -> web.Application:
    validate_secrets(settings)
    app = web.Application(client_max_size=MAX_BODY)
    metrics = IngestMetrics()
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[TOPICS] = names(settings.namespace)  # once, not per request
    app[APPENDER] = Appender(settings.kafka_bootstrap, settings.append_timeout_s, metrics,
                                 **client_options(settings))
    app[CORRELATIONS] = CorrelationStore(settings.postgres_dsn.reveal(), settings.namespace)
    app.router.add_post("/webhooks/{gateway}", receive_webhook)
    app.router.add_put("/correlations/pg/deposits/{deposit_id}", put_correlation)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    # No /metrics here: the webhook port serves webhooks, correlations and health only (DESIGN.md §3);
    # metrics are served on ORDERLY_METRICS_HOST:ORDERLY_METRICS_PORT, as by every other process.
    app[REFUSALS] = SampledLog(log, first=REFUSALS_LOGGED_PER_MINUTE, window_s=60.0,
                               on_suppressed=lambda key: metrics.log_suppressed.labels(log.name).inc())
    app[RECEIVER] = Receiver(settings, metrics, app[APPENDER], app[REFUSALS], app[TOPICS])

    async def report_suppressed() -> None:
        while True:
            await asyncio.sleep(5)
            app[REFUSALS].flush()

    async def lifecycle(app: web.Application) -> Any:
        runner = (await serve_metrics(metrics.registry, settings.metrics_port, settings.metrics_host)
                  if settings.metrics_port else None)
        reporting = asyncio.create_task(report_suppressed())
        await app[APPENDER].start()
        yield
        reporting.cancel()
        await app[APPENDER].stop()
        await app[CORRELATIONS].close()
        if runner is not None:
            await runner.cleanup()

    app.cleanup_ctx.append(lifecycle)
    return app


def server_options(settings: Settings) -> dict[str, Any]:
    """aiohttp's per-connection limits. Its keep-alive timer also runs from the moment a connection
    opens until its first request's headers are complete, so it bounds a slow header sender
    (slowloris) as the read timeout bounds a slow body."""
    return {"keepalive_timeout": settings.read_timeout_s}


def webhook_site(runner: web.AppRunner, host: str, port: int, app: web.Application) -> WebhookSite:
    """The listening site of `orderly ingest`: the webhook fast path in front of aiohttp's protocol."""
    receiver = app[RECEIVER]
    return WebhookSite(runner, host, port, receive=receiver.webhook,
                       gateways=frozenset(name for name in registry.GATEWAYS if receiver.serves(name)),
                       max_body=MAX_BODY, keepalive_s=receiver.settings.read_timeout_s,
                       on_hand_over=app[METRICS].handed_over.inc)


async def serve(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT, then stop listening, finish the answers in flight, clean up."""
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, handle_signals=True, **server_options(settings))
    await runner.setup()
    try:
        await webhook_site(runner, settings.ingest_host, settings.ingest_port, app).start()
        log.info("ingest listening on http://%s:%d", settings.ingest_host, settings.ingest_port)
        await asyncio.Event().wait()  # until a signal raises GracefulExit out of the loop
    finally:
        await runner.cleanup()


def run(settings: Settings) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    main = loop.create_task(serve(settings))
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        main.cancel()  # its finally cleans up: the sites, the answers in flight, the producer
        loop.run_until_complete(asyncio.gather(main, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
