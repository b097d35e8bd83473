"""GatheredAppends (app/producer.py): the ingest's appends, gathered per partition into batches
with one deadline each. A fake aiokafka producer takes whole batches and lets the test decide
when (and how) each is delivered."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from hypothesis import given, settings
from hypothesis import strategies as st

from app.producer import GatheredAppends


class FakeBuilder:
    def __init__(self, room: int) -> None:
        self.room = room
        self.keys: list[bytes] = []

    def append(self, *, key: bytes, value: bytes, timestamp: Any, headers: Any) -> object | None:
        if self.keys and len(self.keys) == self.room:
            return None  # full; an empty batch takes any record, as aiokafka's does
        self.keys.append(key)
        return object()


class FakeKafka:
    """Every batch handed over, with its delivery future; ``refuse`` makes send_batch raise."""

    def __init__(self, room: int = 100) -> None:
        self.room = room
        self.handed: list[tuple[str, int, list[bytes], asyncio.Future[Any]]] = []
        self.refuse: Exception | None = None
        self.queue_free = asyncio.Event()  # send_batch waits on it, as aiokafka's for the previous batch
        self.queue_free.set()

    def create_batch(self) -> FakeBuilder:
        return FakeBuilder(self.room)

    async def send_batch(self, builder: FakeBuilder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        await self.queue_free.wait()
        if self.refuse is not None:
            raise self.refuse
        delivered = asyncio.get_running_loop().create_future()
        self.handed.append((topic, partition, list(builder.keys), delivered))
        return delivered

    def deliver_all(self) -> None:
        for *_, delivered in self.handed:
            if not delivered.done():
                delivered.set_result("metadata")


def run(scenario: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(scenario)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def outcome(future: asyncio.Future[None]) -> str:
    if not future.done():
        return "waiting"
    if future.cancelled():
        return "cancelled"
    error = future.exception()
    return "acked" if error is None else type(error).__name__


def test_appends_of_one_moment_go_in_one_batch_per_partition_and_wait_for_its_acknowledgement() -> None:
    async def scenario() -> tuple[list[Any], list[str], list[str]]:
        kafka = FakeKafka()
        gathered = GatheredAppends(kafka, timeout_s=5)  # type: ignore[arg-type]
        waits = [gathered.append("raw", p, f"k{i}".encode(), b"v", []) for i, p in enumerate([0, 3, 0, 3, 0])]
        await settle()
        before = [outcome(w) for w in waits]
        kafka.deliver_all()
        await settle()
        return [(t, p, keys) for t, p, keys, _ in kafka.handed], before, [outcome(w) for w in waits]

    handed, before, after = run(scenario())
    assert handed == [("raw", 0, [b"k0", b"k2", b"k4"]), ("raw", 3, [b"k1", b"k3"])]
    assert before == ["waiting"] * 5  # nobody is answered before Kafka acknowledged
    assert after == ["acked"] * 5


def test_records_that_come_while_a_batch_waits_make_the_next_batch_in_order() -> None:
    async def scenario() -> list[list[bytes]]:
        kafka = FakeKafka(room=2)
        kafka.queue_free.clear()  # the partition's previous batch is still in aiokafka's queue
        gathered = GatheredAppends(kafka, timeout_s=5)  # type: ignore[arg-type]
        waits = [gathered.append("raw", 0, b"a", b"v", [])]
        await settle()  # "a"'s batch is taken and waits
        waits += [gathered.append("raw", 0, key, b"v", []) for key in (b"b", b"c", b"d")]
        await settle()
        kafka.queue_free.set()
        await settle()
        kafka.deliver_all()
        await settle()
        assert [outcome(w) for w in waits] == ["acked"] * 4
        return [keys for _, _, keys, _ in kafka.handed]

    assert run(scenario()) == [[b"a"], [b"b", b"c"], [b"d"]]  # a full batch continues in the next


def test_a_failed_delivery_fails_its_batch_only() -> None:
    async def scenario() -> list[str]:
        kafka = FakeKafka()
        gathered = GatheredAppends(kafka, timeout_s=5)  # type: ignore[arg-type]
        first = [gathered.append("raw", 0, b"a", b"v", []), gathered.append("raw", 1, b"b", b"v", [])]
        await settle()
        kafka.handed[0][3].set_exception(KafkaConnectionError())
        kafka.handed[1][3].set_result("metadata")
        later = gathered.append("raw", 0, b"c", b"v", [])
        await settle()
        kafka.deliver_all()
        await settle()
        return [outcome(w) for w in [*first, later]]

    assert run(scenario()) == ["KafkaConnectionError", "acked", "acked"]


def test_a_batch_the_producer_refuses_fails_its_callers_and_the_next_one_is_sent() -> None:
    async def scenario() -> tuple[list[str], int]:
        kafka = FakeKafka()
        kafka.refuse = KafkaTimeoutError()
        gathered = GatheredAppends(kafka, timeout_s=5)  # type: ignore[arg-type]
        refused = gathered.append("raw", 0, b"a", b"v", [])
        await settle()
        kafka.refuse = None
        later = gathered.append("raw", 0, b"b", b"v", [])
        await settle()
        kafka.deliver_all()
        await settle()
        return [outcome(refused), outcome(later)], len(kafka.handed)

    assert run(scenario()) == (["KafkaTimeoutError", "acked"], 1)


def test_no_acknowledgement_within_the_deadline_is_a_timeout_and_a_late_one_changes_nothing() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        kafka = FakeKafka()
        gathered = GatheredAppends(kafka, timeout_s=0.05)  # type: ignore[arg-type]
        waits = [gathered.append("raw", 0, b"a", b"v", []), gathered.append("raw", 0, b"b", b"v", [])]
        await asyncio.sleep(0.1)
        expired = [outcome(w) for w in waits]
        kafka.deliver_all()  # Kafka acknowledges after all: the callers were answered already
        await settle()
        return expired, [outcome(w) for w in waits]

    expired, after = run(scenario())
    assert expired == ["TimeoutError", "TimeoutError"]
    assert after == expired


def test_a_batch_past_half_its_deadline_takes_no_more_records_and_an_expired_one_is_not_sent() -> None:
    async def scenario() -> tuple[list[str], list[list[bytes]]]:
        kafka = FakeKafka()
        kafka.queue_free.clear()  # nothing can be handed over: batches wait in the queue
        gathered = GatheredAppends(kafka, timeout_s=0.2)  # type: ignore[arg-type]
        first = gathered.append("raw", 0, b"a", b"v", [])  # its batch is taken and waits
        await settle()
        old = gathered.append("raw", 0, b"b", b"v", [])
        await asyncio.sleep(0.12)  # past half of b's batch's deadline
        fresh = gathered.append("raw", 0, b"c", b"v", [])  # a batch of its own: its full deadline
        await asyncio.sleep(0.1)  # a's and b's batches expired, c's not
        kafka.queue_free.set()
        await settle()
        kafka.deliver_all()
        await settle()
        return [outcome(first), outcome(old), outcome(fresh)], [keys for _, _, keys, _ in kafka.handed]

    outcomes, handed = run(scenario())
    assert outcomes == ["TimeoutError", "TimeoutError", "acked"]
    assert handed == [[b"a"], [b"c"]]  # b's batch expired before it was handed over: not sent


def test_a_cancelled_caller_does_not_disturb_the_others_in_its_batch() -> None:
    async def scenario() -> list[str]:
        kafka = FakeKafka()
        gathered = GatheredAppends(kafka, timeout_s=5)  # type: ignore[arg-type]
        waits = [gathered.append("raw", 0, key, b"v", []) for key in (b"a", b"b")]
        waiting = asyncio.ensure_future(waits[0])
        await settle()
        waiting.cancel()
        await settle()
        kafka.deliver_all()
        await settle()
        return [outcome(w) for w in waits]

    assert run(scenario()) == ["cancelled", "acked"]


@settings(max_examples=60, deadline=None)
@given(appends=st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=40),
       room=st.integers(1, 5))
def test_every_record_is_handed_over_once_per_partition_in_append_order(appends: list[tuple[int, bool]],
                                                                         room: int) -> None:
    """Appends to random partitions, with the event loop running between some of them: each
    partition's records are handed over once each, in the order they were appended, and every
    caller is acknowledged."""

    async def scenario() -> None:
        kafka = FakeKafka(room=room)
        gathered = GatheredAppends(kafka, timeout_s=5)  # type: ignore[arg-type]
        waits = []
        for i, (partition, yield_after) in enumerate(appends):
            waits.append(gathered.append("raw", partition, f"{partition}:{i}".encode(), b"v", []))
            if yield_after:
                await asyncio.sleep(0)
        await settle()
        kafka.deliver_all()
        await settle()
        assert [outcome(w) for w in waits] == ["acked"] * len(appends)
        for partition in {p for p, _ in appends}:
            sent = [key for _, p, keys, _ in kafka.handed if p == partition for key in keys]
            assert sent == [f"{partition}:{i}".encode() for i, (p, _) in enumerate(appends) if p == partition]
        assert all(len(keys) <= room for *_, keys, _ in kafka.handed)

    run(scenario())


def test_a_record_larger_than_a_batch_goes_alone() -> None:
    async def scenario() -> list[list[bytes]]:
        kafka = FakeKafka(room=1)
        gathered = GatheredAppends(kafka, timeout_s=5)  # type: ignore[arg-type]
        waits = [gathered.append("raw", 0, key, b"v", []) for key in (b"a", b"b")]
        await settle()
        kafka.deliver_all()
        await settle()
        assert [outcome(w) for w in waits] == ["acked", "acked"]
        return [keys for _, _, keys, _ in kafka.handed]

    assert run(scenario()) == [[b"a"], [b"b"]]


@pytest.mark.parametrize("room", [1, 3])
def test_nothing_is_left_waiting_when_every_batch_is_refused(room: int) -> None:
    async def scenario() -> list[str]:
        kafka = FakeKafka(room=room)
        kafka.refuse = KafkaConnectionError()
        gathered = GatheredAppends(kafka, timeout_s=5)  # type: ignore[arg-type]
        waits = [gathered.append("raw", 0, f"{i}".encode(), b"v", []) for i in range(5)]
        await settle()
        return [outcome(w) for w in waits]

    assert run(scenario()) == ["KafkaConnectionError"] * 5
