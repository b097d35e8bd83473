"""Helpers shared by the integration and end-to-end tests: a served ingest, topic reads, signing."""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
from aiohttp import web
from aiokafka import AIOKafkaConsumer

from app.ingest.app import METRICS, PROTOCOL_OPTIONS, create_app, server_options, webhook_site
from app.metrics import IngestMetrics
from app.settings import DEV_DEFAULTS, Settings
from app.simulator.deliver import signed_headers as simulator_headers
from app.stack.process import free_port
from topics.catalog import REQUEST_BYTES

CARD_SECRET = "whsec_dGVzdC1jYXJkLWtleS1mb3Itb3JkZXJseS10ZXN0cw=="


# How long the ingest waits for Kafka to take a webhook before answering 503. Production's default
# is 5 s; the suite runs two lanes on 2 cores, where the lane's broker once went 3 s without an
# acknowledgement (CI: a correlation and a webhook of test_replay_race answered 503 together).
# Tests of an outage set a short deadline of their own.
APPEND_TIMEOUT_S = "10"


def make_settings(kafka_bootstrap: str, postgres_dsn: str, namespace: str, **overrides: object) -> Settings:
    env = {**DEV_DEFAULTS, "ORDERLY_KAFKA": kafka_bootstrap, "ORDERLY_POSTGRES_DSN": postgres_dsn,
           "ORDERLY_NAMESPACE": namespace, "ORDERLY_PARTITIONS": "3", "ORDERLY_SECRET_PG": "pg-test-secret",
           "ORDERLY_SECRET_CARD": CARD_SECRET, "ORDERLY_SECRET_PAYMOS": "paymos-test-secret",
           "ORDERLY_API_TOKEN": "test-token", "ORDERLY_APPEND_TIMEOUT_S": APPEND_TIMEOUT_S,
           "ORDERLY_ADMIN_TOKEN": secrets.token_urlsafe(24)}  # each test's own, as each stack's
    return Settings.from_env(env).with_overrides(**overrides)


def admin_token(settings: Settings) -> str:
    """The admin API's break-glass token, which every test's settings hold (random, make_settings)."""
    assert settings.admin_token is not None
    return settings.admin_token.reveal()


def signed_headers(gateway: str, body: bytes, settings: Settings, now: float | None = None) -> dict[str, str]:
    """The gateway's own signature headers for ``body`` with the first configured secret."""
    return simulator_headers(gateway, body, settings.secrets[gateway].reveal()[0], now)


@dataclass
class ServedIngest:
    url: str
    metrics: IngestMetrics
    metrics_url: str = ""  # its /metrics, on a port of its own (the webhook port serves none)


@contextmanager
def serve_in_thread(app: web.Application, site: Callable[[web.AppRunner, str, int], web.BaseSite] = web.TCPSite,
                    **server_options: Any) -> Iterator[str]:
    """Serve an aiohttp app on a loopback port from a thread with its own event loop (through ``site``,
    aiohttp's TCP site unless told); yields its URL. The port is the kernel's pick at the bind (port
    0): no other server can have drawn it meanwhile."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None, **server_options)
    ready = threading.Event()
    bound: list[int] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(site(runner, "127.0.0.1", 0).start())
        bound.extend(address[1] for address in runner.addresses)
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(20) and len(bound) == 1, f"server did not start (bound to {bound})"
    try:
        yield f"http://127.0.0.1:{bound[0]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(20)


@contextmanager
def serve_ingest(settings: Settings, metrics_port: int = 0) -> Iterator[ServedIngest]:
    """Run the real ingest app on a loopback port in a thread with its own event loop; its /metrics
    on ``metrics_port`` (0: a free port), apart from the webhook port as in `orderly ingest`."""
    port = metrics_port or free_port()  # bound at once, as the app starts below
    app = create_app(settings.with_overrides(metrics_port=port, metrics_host="127.0.0.1"))
    with serve_in_thread(app, partial(webhook_site, app=app), **PROTOCOL_OPTIONS) as url:
        yield ServedIngest(url, app[METRICS], f"http://127.0.0.1:{port}/metrics")


@contextmanager
def serve_ingest_as_run(settings: Settings) -> Iterator[ServedIngest]:
    """The ingest with the connection limits that `orderly ingest` serves it with (app/ingest/app.py's run)."""
    port = free_port()  # bound at once, as the app starts below
    app = create_app(settings.with_overrides(metrics_port=port, metrics_host="127.0.0.1"))
    with serve_in_thread(app, partial(webhook_site, app=app), **server_options(settings)) as url:
        yield ServedIngest(url, app[METRICS], f"http://127.0.0.1:{port}/metrics")


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, str]


@asynccontextmanager
async def assigned_consumer(bootstrap: str, topic: str, isolation: str = "read_uncommitted"
                            ) -> AsyncIterator[AIOKafkaConsumer]:
    """A group-less consumer of every partition of ``topic``, once it has them."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, enable_auto_commit=False,
                                max_partition_fetch_bytes=REQUEST_BYTES,
                                isolation_level=isolation, auto_offset_reset="earliest")
    await consumer.start()
    try:
        async with asyncio.timeout(10):
            while not consumer.assignment():
                await asyncio.sleep(0.05)
        yield consumer
    finally:
        await consumer.stop()


async def records_written(bootstrap: str, topic: str) -> int:
    """How many records ``topic`` holds, committed or not (the sum of its high watermarks)."""
    async with assigned_consumer(bootstrap, topic) as consumer:
        return sum((await consumer.end_offsets(list(consumer.assignment()))).values())


async def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Record]:
    """Every record of ``topic`` up to its current end, in partition/offset order."""
    async with assigned_consumer(bootstrap, topic, isolation) as consumer:
        tps = sorted(consumer.assignment())
        ends = await consumer.end_offsets(tps)
        found: list[Record] = []
        async with asyncio.timeout(30):
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                batch = await consumer.getmany(timeout_ms=300)
                for tp, msgs in batch.items():
                    found += [Record(tp.topic, tp.partition, m.offset, m.key, m.value,
                                     {k: v.decode(errors="replace") for k, v in m.headers}) for m in msgs]
        return sorted(found, key=lambda r: (r.partition, r.offset))


async def decided_at(bootstrap: str, topic: str) -> dict[str, float]:
    """Delivery id -> wall-clock time of its first decision (the decision record's timestamp, set by
    the worker's producer when it sent it)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", max_partition_fetch_bytes=REQUEST_BYTES,
                                isolation_level="read_committed")  # not a decision an aborted transaction held
    await consumer.start()
    found: dict[str, float] = {}
    try:
        async with asyncio.timeout(60):
            while not consumer.assignment():
                await asyncio.sleep(0.05)
            tps = sorted(consumer.assignment())
            ends = await consumer.end_offsets(tps)
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                for messages in (await consumer.getmany(timeout_ms=300, max_records=5000)).values():
                    for m in messages:
                        found.setdefault(orjson.loads(m.value)["delivery_id"], m.timestamp / 1000)
    finally:
        await consumer.stop()
    return found
