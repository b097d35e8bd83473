"""The admin's shared context: settings, the PostgreSQL pool, Kafka reached lazily, lag, metrics (I/O shell)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import asyncpg
from aiohttp import web
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from app.admin import auth, queries, sessions
from app.admin.oidc import Issuer
from app.admin.overview import Counted, SharedCounts, kind_only
from app.admin.sessions import Identity
from app.kafka_client import client_options
from app.metrics import AdminMetrics
from app.producer import KeyedProducer
from app.readiness import Readiness
from app.settings import Settings, SettingsError
from app.waits import within
from projections.migrate import quote_ident
from topics.catalog import TopicNames, names

log = logging.getLogger("orderly.admin")
LAG_INTERVAL_S = 15.0
POSTGRES_DEADLINE_S = 10.0  # a query, or the wait for a pooled connection: past it, 503
COUNT_DEADLINE_S = 600.0  # the overview's count, which reads the whole history in the background
ACTIONS_AT_ONCE = 2  # actions may wait on Kafka holding a connection: the rest of the pool serves reads


class Admin:
    """What the handlers share: settings, the PostgreSQL pool, Kafka (reached lazily, so the
    admin serves PostgreSQL's view while Kafka is away), metrics and the login throttle."""

    @staticmethod
    def check(settings: Settings) -> str | None:
        """The break-glass token (None when off). Without an issuer and without the token nobody could
        sign in: the process stops before it serves anything."""
        token = settings.admin_token.reveal() if settings.admin_token else None
        if token is not None and len(token.strip()) < 12:
            raise SettingsError("ORDERLY_ADMIN_TOKEN is shorter than 12 characters: choose a long random one")
        if settings.admin_oidc_issuer and not (settings.admin_oidc_client_id and settings.admin_oidc_redirect_url):
            raise SettingsError("ORDERLY_ADMIN_OIDC_ISSUER needs ORDERLY_ADMIN_OIDC_CLIENT_ID and "
                                "ORDERLY_ADMIN_OIDC_REDIRECT_URL")
        if settings.admin_oidc_issuer and not auth.parse_role_map(settings.admin_role_map):
            raise SettingsError("ORDERLY_ADMIN_ROLE_MAP is empty: no one signing in would get a role")
        if not settings.admin_oidc_issuer and token is None:
            raise SettingsError("neither ORDERLY_ADMIN_OIDC_ISSUER nor ORDERLY_ADMIN_TOKEN is set: the admin API "
                                "and console refuse to run when no one could sign in")
        return token

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.token: str | None = self.check(settings)
        self.issuer: Issuer | None = None
        if settings.admin_oidc_issuer and settings.admin_oidc_client_id and settings.admin_oidc_redirect_url:
            secret = settings.admin_oidc_client_secret.reveal() if settings.admin_oidc_client_secret else None
            self.issuer = Issuer(settings.admin_oidc_issuer, settings.admin_oidc_client_id, secret,
                                 settings.admin_oidc_redirect_url)
        self.role_map = auth.parse_role_map(settings.admin_role_map)
        self.proxies = auth.trusted(settings.admin_trusted_proxies)
        self.flash_key = b""  # the random server key, read at start (app/admin/sessions.py)
        self.names: TopicNames = names(settings.namespace)
        self.metrics = AdminMetrics()
        self.throttle = auth.LoginThrottle()
        self.readiness = Readiness()  # /readyz: what the admin waits for (PostgreSQL), and why
        self.pool: asyncpg.Pool | None = None
        self.counts = SharedCounts(self._count, first_wait_s=POSTGRES_DEADLINE_S, changed=self._last_change,
                                   took=self.metrics.overview_count_seconds.set,
                                   failed=lambda exc: self.metrics.overview_count_failures.inc())
        self.acting = Acting(self.counts)
        self._producer: KeyedProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._kafka_admin: AIOKafkaAdminClient | None = None
        self._lag_task: asyncio.Task[None] | None = None
        self.lag: dict[str, Any] = {"groups": [], "error": "not measured yet"}
        self.lag_failure: str | None = None  # the last failure's text, logged once

    async def start(self) -> None:
        self.pool = await asyncpg.create_pool(
            self.settings.postgres_dsn.reveal(), min_size=1, max_size=ACTIONS_AT_ONCE + 4, timeout=POSTGRES_DEADLINE_S,
            command_timeout=POSTGRES_DEADLINE_S, server_settings={"search_path": quote_ident(self.settings.namespace)})
        async with self.db() as conn:
            self.flash_key = await sessions.server_key(conn)
        self._lag_task = asyncio.create_task(self._measure_lag_forever())

    async def stop(self) -> None:
        if self._lag_task is not None:
            self._lag_task.cancel()
        await self.counts.close()  # a count under way holds a connection the pool's close would wait for
        for closing in (self._producer.stop() if self._producer else None,
                        self._consumer.stop() if self._consumer else None,
                        self._kafka_admin.close() if self._kafka_admin else None):
            if closing is not None:
                try:
                    await within(closing, 5)
                except Exception as exc:  # stopping: what failed to close is only logged
                    log.info("closing a Kafka client: %r", exc)
        if self.pool is not None:
            await self.pool.close()

    def db(self) -> Pooled:
        """A pooled connection, waited for at most POSTGRES_DEADLINE_S (a stopped PostgreSQL, or a
        pool taken by slow queries, answers 503 instead of holding the request)."""
        assert self.pool is not None
        return Pooled(self.pool)

    async def _count(self) -> Counted:
        async with self.db() as conn:
            started = time.monotonic()
            counts = await queries.overview(conn, within_s=COUNT_DEADLINE_S)
            return Counted(counts, counts.pop("counted_at"), time.monotonic() - started)

    async def _last_change(self) -> Any:
        async with self.db() as conn:
            return await conn.fetchval(queries.LAST_CHANGE)

    async def producer(self) -> KeyedProducer:
        if self._producer is None:
            producer = KeyedProducer(self.settings.kafka_bootstrap, request_timeout_ms=10_000,
                                     **client_options(self.settings))
            await within(producer.start(), 10)
            self._producer = producer
        return self._producer

    async def _measure_lag_forever(self) -> None:
        while True:
            try:
                self.lag = await within(self.measure_lag(), 10)
                self.lag_failure = None
            except Exception as exc:  # Kafka away: the overview says so, the loop tries again
                # viewers get the failure's kind (Kafka's text names hosts and addresses), the log the
                # text, once for each new text (not every LAG_INTERVAL_S while Kafka stays away)
                text = f"{type(exc).__name__}: {exc}"
                if text != self.lag_failure:
                    log.warning("consumer lag not measured: %s", text)
                self.lag_failure = text
                self.lag = {"groups": self.lag.get("groups", []), "error": kind_only(exc)}
                await self._close_lag_clients()  # not reconnecting in the background: one try per interval
            await asyncio.sleep(LAG_INTERVAL_S)

    async def _close_lag_clients(self) -> None:
        consumer, kafka_admin, self._consumer, self._kafka_admin = self._consumer, self._kafka_admin, None, None
        for closing in (consumer.stop() if consumer else None, kafka_admin.close() if kafka_admin else None):
            if closing is not None:
                with contextlib.suppress(Exception):
                    await within(closing, 5)

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
                        await within(closing, 5)
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
        return self.settings.api_urls.get(gateway)

    def source(self, request: web.Request) -> str:
        """The client's address (behind ORDERLY_ADMIN_TRUSTED_PROXIES: the one they forwarded)."""
        return auth.source(request.remote, request.headers.get("X-Forwarded-For"), self.proxies)

    def secure(self, request: web.Request) -> bool:
        return auth.secure(request.secure, request.remote, request.headers.get("X-Forwarded-Proto"), self.proxies)

    def actor(self, request: web.Request) -> str:
        """``person@address`` for the audit: the signed-in person, or ``break-glass``."""
        identity = request.get(IDENTITY)
        return f"{identity.person if identity else '?'}@{self.source(request)}"


class Acting:
    """``async with admin.acting``: at most ACTIONS_AT_ONCE actions at a time (an action may wait on
    Kafka holding a connection: the rest of the pool serves reads); each makes the overview's counts
    stale, so the page an operator lands on after it counts again."""

    def __init__(self, counts: SharedCounts) -> None:
        self.slots = asyncio.Semaphore(ACTIONS_AT_ONCE)
        self.counts = counts

    async def __aenter__(self) -> None:
        await self.slots.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.slots.release()
        self.counts.stale()


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
IDENTITY = web.RequestKey("identity", Identity)  # who asks (set by app/admin/guard.py)
