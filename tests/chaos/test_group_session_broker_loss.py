"""A consumer group's session against the loss of a broker that only follows the group's log.

Kafka's group coordinator answers a classic member's heartbeat only once every record it has written
to the group's `__consumer_offsets` partition is committed (the heartbeat is a write operation of
its runtime, GroupCoordinatorService.heartbeat), and aiokafka sends the next heartbeat only after
the answer to the last (group_coordinator.py `_heartbeat_routine`). When a follower of that
partition dies, its commits wait until the controllers fence the dead broker and drop it from the
ISR: `broker.session.timeout.ms` (app/stack/kafka.py SESSION_MS). A group whose own session is not
well above that is expelled by a coordinator that never stopped running: seen in the production-
shape test with a 3 s group session while the brokers' was 3 s too. This test kills exactly such a
follower under a member that commits all the time and proves, from the broker's own view, that the
member kept its place with the shortest session the embedded stack allows workers
(docs/production.md, "The group session")."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from app.stack.kafka import SESSION_MS, KafkaCluster

pytestmark = pytest.mark.chaos

GROUP_SESSION_MS = 3000  # the shortest group session the production-shape test runs workers with
LIMIT_S = 90  # a bound on a hung test, not a timing claim
T = TypeVar("T")


async def asked(question: Callable[[], Awaitable[T]]) -> T:
    """An admin request, asked again while it lands on the dead broker (the admin client picks a node)."""
    deadline = time.monotonic() + LIMIT_S
    while True:
        try:
            return await question()
        except KafkaError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)


def java_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units), as Kafka places a group on a partition."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def test_java_hash_matches_known_values() -> None:
    # "".hashCode(), "a".hashCode() and "hello".hashCode() in Java
    assert (java_hash(""), java_hash("a"), java_hash("hello")) == (0, 97, 99162322)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[KafkaCluster]:
    # two brokers and one controller are enough: a produce with acks=all waits for every replica in
    # the ISR whatever min.insync.replicas says, so the dead follower holds the commits alike
    kafka = KafkaCluster(tmp_path / "kafka", 2)
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.kill()


async def _offsets_partition(admin: AIOKafkaAdminClient, group: str) -> tuple[int, int, list[int], list[int]]:
    """The group's `__consumer_offsets` partition: (partition, leader, replicas, isr)."""
    [described] = await admin.describe_topics(["__consumer_offsets"])
    partitions = {p["partition"]: p for p in described["partitions"]}
    index = (java_hash(group) & 0x7FFFFFFF) % len(partitions)
    p = partitions[index]
    return index, p["leader"], list(p["replicas"]), list(p["isr"])


async def _member(admin: AIOKafkaAdminClient, group: str) -> tuple[str, list[str]]:
    [described] = await admin.describe_consumer_groups([group])
    _, _, state, _, _, members, *_ = described.groups[0]
    return str(state), sorted(str(m[0]) for m in members)


async def stopped(consumer: AIOKafkaConsumer) -> None:
    """Stop the consumer while a broker is still down: aiokafka 0.14's ``Fetcher.close`` cancels its
    pending fetches and awaits them without suppressing their CancelledError, so one waiting out its
    retry backoff against the dead broker makes ``stop()`` raise it (seen once, under a busy CPU).
    That CancelledError is not this task's: only a cancellation of the test itself goes on."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if me is not None and me.cancelling():
            raise


async def test_a_member_outlives_the_loss_of_a_follower_of_its_groups_log(cluster: KafkaCluster) -> None:
    assert SESSION_MS * 2 <= GROUP_SESSION_MS, "the brokers' session must leave the group's room"
    topic, group = f"t{uuid.uuid4().hex[:8]}", f"g{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await admin.start()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group,
                                enable_auto_commit=False, session_timeout_ms=GROUP_SESSION_MS,
                                heartbeat_interval_ms=GROUP_SESSION_MS // 6)
    commits: list[float] = []  # the time of each offset commit the coordinator accepted
    refused: list[str] = []
    stop = asyncio.Event()

    async def commit_all_the_time() -> None:  # each commit is a record in the group's log
        n = 0
        while not stop.is_set():
            await consumer.getmany(timeout_ms=50)
            n += 1
            try:
                await consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(0, str(n))
                                       for p in range(3) if TopicPartition(topic, p) in consumer.assignment()})
                commits.append(time.monotonic())
            except Exception as exc:  # a commit held past its timeout, or refused after an expulsion
                refused.append(repr(exc))

    try:
        await admin.create_topics([NewTopic(topic, 3, 2)])
        await consumer.start()
        committing = asyncio.create_task(commit_all_the_time())
        deadline = time.monotonic() + LIMIT_S
        while not commits:
            assert time.monotonic() < deadline and not committing.done(), refused[-3:]
            await asyncio.sleep(0.1)
        state, before = await asked(lambda: _member(admin, group))
        assert state == "Stable" and len(before) == 1, (state, before)
        index, leader, replicas, _isr = await asked(lambda: _offsets_partition(admin, group))
        follower = next(node for node in replicas if node != leader)
        cluster.node(follower).kill()
        # the positive signals: the controllers dropped the dead follower from the ISR, and the
        # coordinator accepted commits after that (its held answers were sent)
        while follower in (await asked(lambda: _offsets_partition(admin, group)))[3]:
            assert time.monotonic() < deadline, "the dead follower never left the ISR"
            await asyncio.sleep(0.1)
        shrunk = time.monotonic()
        while sum(1 for t in commits if t > shrunk) < 3:
            assert time.monotonic() < deadline and not committing.done(), refused[-3:]
            await asyncio.sleep(0.1)
        state, after = await asked(lambda: _member(admin, group))
        assert (state, after) == ("Stable", before), (
            f"the member was expelled while a follower of __consumer_offsets-{index} was being fenced: "
            f"{before} became {after} ({state}); refused commits: {refused[-3:]}")
        assert consumer.assignment() == {TopicPartition(topic, p) for p in range(3)}
        stop.set()
        await committing
    finally:
        stop.set()
        await stopped(consumer)
        await admin.close()
