"""The exactly-once recovery's highwaters, on the started broker: the offset of each partition's last
committed record, whatever the transactions after it left in the log.

Faust's own highwater with exactly-once is the cached last stable offset minus one, a commit
marker's offset that recovery can never reach (a 10 s wait on every start), or -1 before the first
fetch (an empty store skipping recovery). app/worker/recovery.py asks the broker instead.
"""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from faust.types import TP

from app.stack.kafka import KafkaBroker
from app.worker.recovery import TAIL, last_committed_offsets


async def _topic(kafka: KafkaBroker, partitions: int) -> str:
    topic = f"hw-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    return topic


async def _transaction(producer: AIOKafkaProducer, topic: str, partition: int, count: int, commit: bool) -> list[int]:
    """``count`` records in one transaction, committed or aborted; their offsets."""
    offsets = []
    await producer.begin_transaction()
    for i in range(count):
        meta = await (await producer.send(topic, b"v%d" % i, key=b"k%d" % i, partition=partition))
        offsets.append(meta.offset)
    if commit:
        await producer.commit_transaction()
    else:
        await producer.abort_transaction()
    return offsets


async def test_the_highwater_is_the_last_committed_record_not_a_marker_or_an_aborted_one(kafka: KafkaBroker) -> None:
    topic = await _topic(kafka, 5)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=f"tx-{topic}")
    await producer.start()
    try:
        # 0: committed transactions only; its end is a commit marker
        committed = await _transaction(producer, topic, 0, 3, commit=True)
        committed += await _transaction(producer, topic, 0, 2, commit=True)
        # 1: a committed transaction, then an aborted one (records and an abort marker after it)
        kept = await _transaction(producer, topic, 1, 2, commit=True)
        await _transaction(producer, topic, 1, 5, commit=False)
        # 2: more aborted records after the last committed one than the first tail read covers
        deep = await _transaction(producer, topic, 2, 1, commit=True)
        for _ in range(3):
            await _transaction(producer, topic, 2, TAIL, commit=False)
        # 3: aborted transactions only; 4: nothing at all
        await _transaction(producer, topic, 3, 4, commit=False)
    finally:
        await producer.stop()

    highwaters = await last_committed_offsets(kafka.bootstrap, [TP(topic, p) for p in range(5)])

    assert highwaters == {TP(topic, 0): committed[-1], TP(topic, 1): kept[-1], TP(topic, 2): deep[-1],
                          TP(topic, 3): -1, TP(topic, 4): -1}
    # the marker after each committed transaction: Faust's highwater (last stable offset - 1) is past the record
    assert committed[-1] < await _stable(kafka, TP(topic, 0)) - 1


async def test_a_log_without_transactions_ends_on_its_last_record(kafka: KafkaBroker) -> None:
    topic = await _topic(kafka, 2)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        metas = [await (await producer.send(topic, b"v", partition=0)) for _ in range(7)]
    finally:
        await producer.stop()

    highwaters = await last_committed_offsets(kafka.bootstrap, [TP(topic, 0), TP(topic, 1)])

    assert highwaters == {TP(topic, 0): metas[-1].offset, TP(topic, 1): -1}


async def _stable(kafka: KafkaBroker, tp: TP) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        part = TopicPartition(tp.topic, tp.partition)
        return int((await consumer.end_offsets([part]))[part])
    finally:
        await consumer.stop()


async def test_a_store_ahead_of_the_last_stable_offset_waits_for_the_commit_markers(kafka: KafkaBroker) -> None:
    """The transaction coordinator acknowledges a commit before its markers are written: the local
    store (written once the commit returned) may then hold a changelog offset past the last stable
    one. Faust's consistency check ends the worker if the highwater read is below the store's
    offset; the read waits for the markers instead. Here the markers are held back by leaving the
    transaction open while the read starts, and committing it a moment later."""
    topic = await _topic(kafka, 1)
    tp = TP(topic, 0)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=f"tx-{topic}")
    await producer.start()
    try:
        first = await _transaction(producer, topic, 0, 2, commit=True)
        await producer.begin_transaction()
        held = (await (await producer.send(topic, b"v", key=b"k", partition=0))).offset  # the store's offset
        read = asyncio.ensure_future(last_committed_offsets(kafka.bootstrap, [tp], floor={tp: held}))
        await asyncio.sleep(0.5)  # the read has seen the last stable offset before `held`
        await producer.commit_transaction()
        assert await read == {tp: held}
    finally:
        await producer.stop()
    # without a floor the read ends at once on what is committed
    assert await last_committed_offsets(kafka.bootstrap, [tp]) == {tp: held}
    assert first[-1] < held
