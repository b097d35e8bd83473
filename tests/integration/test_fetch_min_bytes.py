"""The worker's busy fetches (app.worker.consumer.fetch_min_bytes) and the sinks' pace (app/sink.py),
set by app/seams/aiokafka.py on a started consumer: the minimum and the wait really reach the broker,
which then holds a fetch that has less than the minimum until the wait ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from app.core.pacing import BUSY_BATCH
from app.seams.aiokafka import set_fetch_min_bytes, set_fetch_pace
from app.sink import BUSY_FETCH, QUIET_FETCH
from app.stack.kafka import KafkaBroker
from app.worker.consumer import BUSY_FETCH_MIN_BYTES, fetch_min_bytes

WAIT_MS = 1500


async def _first_record_after(consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, topic: str) -> float:
    """Seconds from sending one small record to the consumer's getmany returning it."""
    await producer.send_and_wait(topic, b"x")
    started = time.monotonic()
    async with asyncio.timeout(20):
        while not await consumer.getmany(timeout_ms=WAIT_MS * 2):
            pass
    return time.monotonic() - started


@asynccontextmanager
async def _clients(kafka: KafkaBroker, topic: str, **consumer: Any) -> AsyncIterator[tuple[AIOKafkaConsumer,
                                                                                        AIOKafkaProducer]]:
    """A fresh one-partition ``topic``, a producer, and a started consumer of it built with ``consumer``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    reader = AIOKafkaConsumer(topic, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest",
                              enable_auto_commit=False, **consumer)
    await producer.start()
    await reader.start()
    try:
        yield reader, producer
    finally:
        await reader.stop()
        await producer.stop()


async def test_a_busy_fetch_waits_for_more_and_a_quiet_one_does_not(kafka: KafkaBroker, namespace: str) -> None:
    assert fetch_min_bytes(BUSY_BATCH - 1) == 1 and fetch_min_bytes(BUSY_BATCH) == BUSY_FETCH_MIN_BYTES
    topic = f"{namespace}.fetch"
    async with _clients(kafka, topic, fetch_max_wait_ms=WAIT_MS) as (consumer, producer):
        # Each change applies from the next fetch request: the one in flight returns a record first.
        set_fetch_min_bytes(consumer, fetch_min_bytes(BUSY_BATCH))
        await _first_record_after(consumer, producer, topic)
        busy = await _first_record_after(consumer, producer, topic)
        set_fetch_min_bytes(consumer, fetch_min_bytes(1))
        await _first_record_after(consumer, producer, topic)
        quiet = await _first_record_after(consumer, producer, topic)
    # The broker held the busy fetch (a few bytes, not 256 KiB) for the whole wait; the quiet one
    # answered with the record.
    assert busy >= WAIT_MS / 1000 * 0.8, busy
    assert quiet < busy / 2, (quiet, busy)


async def test_a_sinks_pace_set_on_a_started_consumer_reaches_the_broker(kafka: KafkaBroker, namespace: str) -> None:
    """app/sink.py's pace (set_fetch_pace): the wait and the minimum both change from the next fetch
    request on. A fetch that asks for more than a record holds it for the wait given, long or short;
    one that asks for any byte answers the record at once."""
    topic = f"{namespace}.pace"
    async with _clients(kafka, topic, fetch_min_bytes=BUSY_FETCH[0], fetch_max_wait_ms=WAIT_MS) as (
            consumer, producer):
        await _first_record_after(consumer, producer, topic)  # the first fetch, as started
        held = await _first_record_after(consumer, producer, topic)
        set_fetch_pace(consumer, BUSY_FETCH[0], 100)  # the same minimum, a short wait
        await _first_record_after(consumer, producer, topic)
        short = await _first_record_after(consumer, producer, topic)
        set_fetch_pace(consumer, QUIET_FETCH[0], WAIT_MS)  # any byte, the long wait
        await _first_record_after(consumer, producer, topic)
        quiet = await _first_record_after(consumer, producer, topic)
    assert held >= WAIT_MS / 1000 * 0.8, held
    assert short < held / 2, (short, held)  # the new wait reached the broker
    assert quiet < held / 2, (quiet, held)  # and so did the new minimum
