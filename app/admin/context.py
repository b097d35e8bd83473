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

from app.admin import auth, queries
from app.kafka_client import client_options
from app.metrics import AdminMetrics
from app.producer import KeyedProducer
from app.settings import Settings, SettingsError
from projections.migrate import quote_ident
from topics.catalog import TopicNames, names

log = logging.getLogger("orderly.admin")
LAG_INTERVAL_S = 15.0
POSTGRES_DEADLINE_S = 10.0  # a query, or the wait for a pooled connection: past it, 503
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
        return self.settings.api_urls.get(gateway)

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
