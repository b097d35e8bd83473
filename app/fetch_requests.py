"""The fetcher's consumer of orderly.fetch: backfills and operators' fetches, one request at a time (I/O shell)."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from app.gateways import registry
from app.kafka_client import client_options
from app.metrics import FetcherMetrics
from app.producer import KeyedProducer
from app.readiness import UNREACHABLE, Readiness, wait_for_postgres
from app.settings import Settings
from projections import quarantine
from topics.catalog import names

log = logging.getLogger("orderly.fetcher")


class Fetcher(Protocol):
    """What carries a request out (app/fetcher.py's Fetcher)."""

    producer: KeyedProducer
    pool: asyncpg.Pool | None
    readiness: Readiness
    metrics: FetcherMetrics
    requests: AIOKafkaConsumer | None

    async def carry_out(self, request: Any) -> None: ...


async def consume_fetch_requests(fetcher: Fetcher, settings: Settings) -> None:
    """orderly.fetch → backfills (sequence gaps older than the limit) and resource fetches an operator
    asked for. A request that cannot be carried out (a malformed one, an answer the fetcher cannot
    read) is set aside to quarantine and the next one is taken. Raises when the consumer cannot go on
    (Kafka out of reach): the process ends with it (app/fetcher.py run) and is restarted."""
    producer = fetcher.producer
    consumer = AIOKafkaConsumer(names(settings.namespace).fetch, bootstrap_servers=settings.kafka_bootstrap,
                                group_id=f"{settings.namespace}-fetcher", enable_auto_commit=False,
                                group_instance_id=settings.instance_member,  # static membership
                                session_timeout_ms=round(settings.session_timeout_s * 1000),
                                heartbeat_interval_ms=round(settings.heartbeat_interval_s * 1000),
                                auto_offset_reset="earliest", isolation_level="read_committed",
                                **client_options(settings))
    await consumer.start()
    fetcher.requests = consumer
    try:
        async for message in consumer:
            request: Any = None
            try:
                request = orjson.loads(message.value)
                await fetcher.carry_out(request)
            except KafkaError:
                raise
            except UNREACHABLE as exc:  # PostgreSQL away: not the request's fault; carried out once it is back
                assert fetcher.pool is not None
                await wait_for_postgres(fetcher.pool, fetcher.readiness, exc)
                consumer.seek(TopicPartition(message.topic, message.partition), message.offset)
                continue
            except Exception as exc:  # the request's own fault: set aside, never retried for ever
                reason = f"{type(exc).__name__}: {exc}"[:500]
                log.error("fetch request %s[%d]@%d set aside: %s", message.topic, message.partition, message.offset,
                          reason)
                await producer.send_and_wait(*quarantine.set_aside_record(names(settings.namespace), "fetcher",
                                                                          message, reason))
                fetcher.metrics.set_aside.labels("fetcher", gateway_of(request)).inc()
            try:
                await consumer.commit()
            except CommitFailedError as exc:
                # The group moved the partition on while the request was carried out (a backfill
                # longer than the poll interval): whoever holds it now takes the request again, and
                # its appends are duplicates the worker drops. Not a reason to end the process.
                log.warning("fetch request %s[%d]@%d done, but its offset could not be committed: %s",
                            message.topic, message.partition, message.offset, exc)
    finally:
        await consumer.stop()
    raise RuntimeError("the fetch requests' consumer stopped")


def gateway_of(request: Any) -> str:
    """A set-aside request's gateway label: its registered gateway, else "unknown"."""
    name = request.get("gateway") if isinstance(request, dict) else None
    return name if isinstance(name, str) and registry.find(name) is not None else "unknown"
