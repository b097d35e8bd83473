"""The worker's liveness clients after a start that did not finish: the next reading builds them
again (a kept half-started pair answered "Unable to get cluster metadata" for ever, which silenced
the stall check and the lag gauge after a broker incident)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import GroupCoordinatorNotAvailableError, KafkaError

from app.liveness import Liveness
from app.stack.kafka import KafkaBroker
from app.stack.process import spare_port
from tests.support import make_settings
from topics.admin import ensure_topics
from topics.catalog import catalog, names


async def test_a_cancelled_or_failed_start_is_tried_again(kafka: KafkaBroker) -> None:
    namespace = f"live{uuid.uuid4().hex[:8]}"
    settings = make_settings(kafka.bootstrap, "postgresql://unused@127.0.0.1:1/x", namespace)
    await ensure_topics(kafka.bootstrap, catalog(namespace, settings.partitions))
    raw = names(namespace).raw
    liveness = Liveness(kafka.bootstrap, f"{namespace}-worker", 60.0)
    try:
        with pytest.raises(TimeoutError):  # the lag timer's deadline ends the first start half-way
            await asyncio.wait_for(liveness.group_lag(raw), 0.001)
        assert (liveness._consumer, liveness._admin) == (None, None)  # nothing half-started kept
        deadline = time.monotonic() + 30
        while True:  # built again, and it reaches the broker (a fresh broker's group coordinator comes up)
            try:
                assert await liveness.group_lag(raw) == 0
                break
            except GroupCoordinatorNotAvailableError:
                assert time.monotonic() < deadline, "the liveness clients never reached the broker"
                await asyncio.sleep(0.5)
    finally:
        await liveness.close()

    nobody = Liveness(f"127.0.0.1:{spare_port()}", f"{namespace}-worker", 60.0)  # a broker that is away
    with pytest.raises(KafkaError):
        await nobody.group_lag(raw)
    assert (nobody._consumer, nobody._admin) == (None, None)  # nothing half-started kept
    await nobody.close()


async def test_a_worker_given_partitions_that_decides_nothing_is_stalled_after_twice_the_limit(
        kafka: KafkaBroker) -> None:
    """Faust can leave the agent waiting for ever after a rebalance: no batch comes. The worker
    must find itself stalled after twice ORDERLY_WORKER_STALL_S (it allowed ten times, which kept
    a takeover idle 100 s in the two-worker chaos test), and never before the limit."""
    namespace = f"live{uuid.uuid4().hex[:8]}"
    settings = make_settings(kafka.bootstrap, "postgresql://unused@127.0.0.1:1/x", namespace)
    await ensure_topics(kafka.bootstrap, catalog(namespace, settings.partitions))
    raw = names(namespace).raw
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(raw, f"r{i}".encode(), partition=0)
    finally:
        await producer.stop()
    stall_s = 1.0
    liveness = Liveness(kafka.bootstrap, f"{namespace}-worker", stall_s)
    waiting, idle = TopicPartition(raw, 0), TopicPartition(raw, 1)
    try:
        liveness.on_assigned({waiting, idle})
        assigned_at = time.monotonic()
        assert await liveness.stalled() == {}  # within the limit
        while not (stuck := await liveness.stalled()):
            assert time.monotonic() - assigned_at < 8 * stall_s, "not found stalled in 8x the limit"
            await asyncio.sleep(0.1)
        assert stuck == {waiting: 5}  # the idle partition is never stalled
        assert time.monotonic() - assigned_at >= 2 * stall_s
    finally:
        await liveness.close()
