"""Where the worker's consumer began reading a partition, as the broker says it
(app.worker.consumer.Consumer.start_offset, what the skip guard asks when Faust knows no committed
offset): the partition's earliest offset for a group that never committed, its committed offset
once it has, retention included."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.structs import OffsetAndMetadata

from app.seams.faust.consumer import START_OFFSET_TIMEOUT_S, Consumer
from app.stack.kafka import KafkaBroker


def _faust_side(consumer: Any) -> Any:
    """What start_offset reads of Faust's consumer: its thread, which runs a call on the aiokafka
    consumer's loop (here the test's own) and hands over that consumer."""
    async def call_thread(fun: Any, *args: Any) -> Any:
        return await fun(*args)

    thread = SimpleNamespace(call_thread=call_thread, _ensure_consumer=lambda: consumer)
    return SimpleNamespace(_thread=thread, log=logging.getLogger("test"))


async def test_the_start_is_the_earliest_offset_until_the_group_commits(kafka: KafkaBroker, namespace: str) -> None:
    topic = f"{namespace}.start"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka.bootstrap, group_id=f"{namespace}-g",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
        await producer.start()
        for n in range(10):
            await producer.send_and_wait(topic, b"x%d" % n, partition=0)
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(4)}, timeout_ms=10_000)
        await consumer.start()
        async with asyncio.timeout(30):
            while not consumer.assignment():
                await consumer.getmany(timeout_ms=200)
        faust = _faust_side(consumer)
        p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
        assert await Consumer.start_offset(faust, p0) == 4  # nothing committed: the earliest left by retention
        assert await Consumer.start_offset(faust, p1) == 0  # an empty partition
        await consumer.commit({p0: OffsetAndMetadata(7, "")})
        assert await Consumer.start_offset(faust, p0) == 7
        await consumer.commit({p0: OffsetAndMetadata(0, "")})  # committed at 0, which Faust records as unknown
        assert await Consumer.start_offset(faust, p0) == 0
    finally:
        await consumer.stop()
        await producer.stop()
        await admin.close()


async def test_a_broker_that_cannot_answer_gives_no_start() -> None:
    class Away:
        """aiokafka's offset fetch while the group's coordinator is away: it retries without end."""

        async def committed(self, _tp: Any) -> int:
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

    started = time.monotonic()
    assert await Consumer.start_offset(_faust_side(Away()), TopicPartition("t", 0)) is None
    assert time.monotonic() - started < START_OFFSET_TIMEOUT_S + 2  # bounded, not a wait for ever

    async def refuse(*_a: Any) -> Any:
        raise ConnectionError("no broker")

    faust: Any = SimpleNamespace(_thread=SimpleNamespace(call_thread=refuse, _ensure_consumer=lambda: None),
                                 log=logging.getLogger("test"))
    assert await Consumer.start_offset(faust, TopicPartition("t", 0)) is None
