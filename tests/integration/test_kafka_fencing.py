"""KIP-447 fencing on the started broker (app/seams/aiokafka.py): a transaction's offsets carry its
worker's group generation and are refused from a member of an earlier one; committed offsets are
read only once no open transaction holds offsets of their partitions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from faust.types import TP

from app.seams import aiokafka as fencing
from app.stack.kafka import KafkaBroker
from app.worker.recovery import last_committed_offsets


async def create_topics(kafka: KafkaBroker, *topics: NewTopic) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        await admin.create_topics(list(topics))
    finally:
        await admin.close()


async def joined(consumer: AIOKafkaConsumer) -> AIOKafkaConsumer:
    """``consumer`` started and polled until its group gave it its assignment."""
    await consumer.start()
    for _ in range(100):
        await consumer.getmany(timeout_ms=100)
        if consumer.assignment():
            return consumer
    await consumer.stop()
    raise AssertionError("the consumer never joined its group")


@pytest.fixture
async def group(kafka: KafkaBroker, namespace: str) -> AsyncIterator[tuple[str, str, AIOKafkaConsumer, str]]:
    """A source topic, an output topic, and a consumer that is a member of the group's generation."""
    source, output, group_id = f"{namespace}.source", f"{namespace}.out", f"{namespace}-group"
    await create_topics(kafka, NewTopic(source, 2, 1), NewTopic(output, 2, 1))
    fencing.install()
    consumer = await joined(AIOKafkaConsumer(source, bootstrap_servers=kafka.bootstrap, group_id=group_id,
                                             enable_auto_commit=False))
    try:
        fencing.register(group_id)
        yield source, output, consumer, group_id
    finally:
        await consumer.stop()


async def transactional(kafka: KafkaBroker, transactional_id: str) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=transactional_id)
    await producer.start()
    return producer


async def test_the_offsets_of_the_current_member_commit(kafka: KafkaBroker,
                                                        group: tuple[str, str, AIOKafkaConsumer, str]) -> None:
    source, output, consumer, group_id = group
    membership = fencing.group_membership(consumer)
    assert membership.generation >= 1 and membership.member_id
    producer = await transactional(kafka, f"{source}-current")
    try:
        async with producer.transaction():
            await producer.send_and_wait(output, b"decided", partition=0)
            with fencing.pinned(group_id, membership):
                await producer.send_offsets_to_transaction({TopicPartition(source, 0): 5}, group_id)
    finally:
        await producer.stop()
    committed = await consumer.committed(TopicPartition(source, 0))
    assert committed == 5


async def test_a_member_of_an_earlier_generation_cannot_commit_its_offsets(
        kafka: KafkaBroker, group: tuple[str, str, AIOKafkaConsumer, str]) -> None:
    source, output, consumer, group_id = group
    current = fencing.group_membership(consumer)
    # what a worker still believes after its group moved on without it
    stale = current._replace(generation=current.generation + 1)
    producer = await transactional(kafka, f"{source}-zombie")
    try:
        await producer.begin_transaction()
        await producer.send_and_wait(output, b"late", partition=1)
        with pytest.raises(fencing.FencedMemberError, match="no longer a member"), fencing.pinned(group_id, stale):
            await producer.send_offsets_to_transaction({TopicPartition(source, 1): 9}, group_id)
        await producer.abort_transaction()  # all that is left to it
    finally:
        await producer.stop()
    assert await consumer.committed(TopicPartition(source, 1)) is None
    # the write went into the aborted transaction: a read_committed reader never sees it
    written = TopicPartition(output, 1)
    reader = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, isolation_level="read_committed",
                              enable_auto_commit=False)
    await reader.start()
    try:
        reader.assign([written])
        await reader.seek_to_beginning(written)
        end = 0
        for _ in range(100):  # the abort's marker is written after the abort returns; then the log is stable
            end = (await reader.end_offsets([written]))[written]
            if end >= 2:
                break
            await asyncio.sleep(0.1)
        assert end >= 2, "the aborted write and its abort marker are in the log"
        seen: list[bytes] = []
        while await reader.position(written) < end:
            batches = await reader.getmany(written, timeout_ms=500)
            seen += [record.value for record in batches.get(written, [])]
        assert b"late" not in seen
    finally:
        await reader.stop()


async def test_offsets_sent_outside_a_pinned_membership_are_refused(
        kafka: KafkaBroker, group: tuple[str, str, AIOKafkaConsumer, str]) -> None:
    source, output, consumer, group_id = group
    producer = await transactional(kafka, f"{source}-unpinned")
    try:
        await producer.begin_transaction()
        await producer.send_and_wait(output, b"decided", partition=0)
        with pytest.raises(KafkaError):  # the producer's sender fails: the worker's commit ends it
            await asyncio.wait_for(producer.send_offsets_to_transaction({TopicPartition(source, 0): 11}, group_id), 10)
    finally:
        await producer.stop()
    assert await consumer.committed(TopicPartition(source, 0)) is None


async def test_committed_offsets_wait_for_an_open_transaction_that_holds_them(
        kafka: KafkaBroker, group: tuple[str, str, AIOKafkaConsumer, str]) -> None:
    source, output, consumer, group_id = group
    producer = await transactional(kafka, f"{source}-open")
    try:
        await producer.begin_transaction()
        await producer.send_and_wait(output, b"decided", partition=1)
        with fencing.pinned(group_id, fencing.group_membership(consumer)):
            await producer.send_offsets_to_transaction({TopicPartition(source, 1): 7}, group_id)
        fetch = asyncio.ensure_future(consumer.committed(TopicPartition(source, 1)))
        # a positive signal rather than a sleep: the broker answers later questions about the
        # group's offsets (a partition no transaction holds, asked again and again) meanwhile
        for _ in range(5):
            assert await asyncio.wait_for(consumer.committed(TopicPartition(source, 0)), 10) is None
        assert not fetch.done(), "the committed offset was read while a transaction held its update"
        await producer.commit_transaction()
        assert await asyncio.wait_for(fetch, 10) == 7
    finally:
        await producer.stop()


async def test_offsets_taken_before_a_rebalance_are_refused_after_it(
        kafka: KafkaBroker, group: tuple[str, str, AIOKafkaConsumer, str]) -> None:
    """A commit in flight across a rebalance: its offsets were taken in one generation and reach the
    coordinator once another member's join has started the next; they carry the generation they
    were taken in, which the coordinator refuses."""
    source, output, consumer, group_id = group
    taken = fencing.group_membership(consumer)
    producer = await transactional(kafka, f"{source}-in-flight")
    other = AIOKafkaConsumer(source, bootstrap_servers=kafka.bootstrap, group_id=group_id, enable_auto_commit=False)
    await other.start()
    try:
        await producer.begin_transaction()
        await producer.send_and_wait(output, b"decided before the rebalance", partition=0)
        for _ in range(200):  # both members poll until the group has moved on to a later generation
            await asyncio.gather(consumer.getmany(timeout_ms=50), other.getmany(timeout_ms=50))
            if fencing.group_membership(consumer).generation > taken.generation and other.assignment():
                break
        assert fencing.group_membership(consumer).generation > taken.generation, "the group never rebalanced"
        with pytest.raises(fencing.FencedMemberError, match="no longer a member"), fencing.pinned(group_id, taken):
            await producer.send_offsets_to_transaction({TopicPartition(source, 0): 13}, group_id)
        await producer.abort_transaction()
    finally:
        await producer.stop()
        await other.stop()
    assert await consumer.committed(TopicPartition(source, 0)) is None


async def test_a_static_member_replaced_under_its_instance_id_cannot_commit(
        kafka: KafkaBroker, namespace: str) -> None:
    """Another worker started under the same ORDERLY_WORKER_INSTANCE_ID takes the static member's
    place (a new member id); the one it replaced is refused with FENCED_INSTANCE_ID."""
    source, output, group_id = f"{namespace}.static", f"{namespace}.static-out", f"{namespace}-static"
    await create_topics(kafka, NewTopic(source, 1, 1), NewTopic(output, 1, 1))
    fencing.install()

    async def member() -> AIOKafkaConsumer:
        return await joined(AIOKafkaConsumer(source, bootstrap_servers=kafka.bootstrap, group_id=group_id,
                                             group_instance_id="worker-1", enable_auto_commit=False))

    first = await member()
    replaced = fencing.group_membership(first)
    assert replaced.group_instance_id == "worker-1"
    second = await member()
    producer = await transactional(kafka, f"{source}-replaced")
    try:
        current = fencing.group_membership(second)
        assert current.member_id != replaced.member_id
        await producer.begin_transaction()
        await producer.send_and_wait(output, b"late", partition=0)
        with pytest.raises(fencing.FencedMemberError, match=r"error (82|25)"), fencing.pinned(group_id, replaced):
            await producer.send_offsets_to_transaction({TopicPartition(source, 0): 3}, group_id)
        await producer.abort_transaction()
        # the member that took its place commits
        async with producer.transaction():
            with fencing.pinned(group_id, current):
                await producer.send_offsets_to_transaction({TopicPartition(source, 0): 4}, group_id)
        assert await second.committed(TopicPartition(source, 0)) == 4
    finally:
        await producer.stop()
        await second.stop()
        await first.stop()


async def test_recovery_reads_a_changelog_only_once_no_transaction_holds_records_of_it(
        kafka: KafkaBroker, namespace: str) -> None:
    """A new owner's recovery (app/worker/recovery.py) after a previous owner whose transaction is
    still open: it waits for that transaction to end, and then reads up to its last committed record."""
    changelog = TopicPartition(f"{namespace}.changelog", 0)
    await create_topics(kafka, NewTopic(changelog.topic, 1, 1))
    previous_owner = await transactional(kafka, f"{namespace}-previous-owner")
    try:
        async with previous_owner.transaction():
            await previous_owner.send_and_wait(changelog.topic, b"committed", partition=0)
        await previous_owner.begin_transaction()
        await previous_owner.send_and_wait(changelog.topic, b"still open", partition=0)
        tp = TP(changelog.topic, 0)
        recovery = asyncio.ensure_future(last_committed_offsets(kafka.bootstrap, [tp], stable_first=True))
        # a positive signal rather than a sleep: a recovery of a partition no transaction holds is
        # answered, twice, while this one still waits
        free = TopicPartition(f"{namespace}.free", 0)
        await create_topics(kafka, NewTopic(free.topic, 1, 1))
        for _ in range(2):
            assert (await asyncio.wait_for(last_committed_offsets(kafka.bootstrap, [TP(free.topic, 0)],
                                                                  stable_first=True), 20)) == {TP(free.topic, 0): -1}
        assert not recovery.done(), "recovery read the changelog while a transaction held records of it"
        await previous_owner.commit_transaction()
        assert (await asyncio.wait_for(recovery, 20))[tp] == 2  # the second record (after the first commit marker)
    finally:
        await previous_owner.stop()
