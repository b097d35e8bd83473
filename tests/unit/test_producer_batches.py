"""KeyedProducer.enqueue_all / enqueue_partitioned hand every batch over before the sender can run
(app/producer.py): the batches of one worker batch then go in one produce request, not one per task
switch. A fake aiokafka producer records what it is handed and when."""

from __future__ import annotations

import asyncio
from typing import Any

from app.producer import KeyedProducer


class FakeBuilder:
    def __init__(self, room: int) -> None:
        self.room = room
        self.records: list[tuple[bytes, bytes]] = []

    def append(self, *, key: bytes, value: bytes, timestamp: Any, headers: Any) -> object | None:
        if len(self.records) == self.room:
            return None  # full
        self.records.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.records)


class FakeKafka:
    """What the sender would see: every handed batch, and the moments another task ran between them."""

    def __init__(self, room: int = 100) -> None:
        self.room = room
        self.log: list[Any] = []

    def create_batch(self) -> FakeBuilder:
        return FakeBuilder(self.room)

    async def send_batch(self, builder: FakeBuilder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        self.log.append((topic, partition, [k for k, _ in builder.records]))
        done = asyncio.get_running_loop().create_future()
        done.set_result(len(self.log))
        return done


def keyed(kafka: FakeKafka) -> KeyedProducer:
    producer = KeyedProducer("unused:9092")
    producer._producer = kafka
    producer._partitions = {"decisions": 12, "effects": 12}
    return producer


def test_every_batch_is_handed_over_before_another_task_runs() -> None:
    kafka = FakeKafka()

    async def scenario() -> list[Any]:
        producer = keyed(kafka)

        async def sender() -> None:  # the aiokafka sender: woken by the first batch, runs at the next switch
            kafka.log.append("sender ran")

        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(sender()))
        acks = await producer.enqueue_partitioned({
            0: [("decisions", b"pg:a", b"1"), ("effects", b"e:a", b"2")],
            3: [("decisions", b"pg:b", b"3"), ("effects", b"e:b", b"4")],
            7: [("decisions", b"pg:c", b"5")],
        })
        return list(await acks)

    results = asyncio.run(scenario())
    handed = [entry for entry in kafka.log if entry != "sender ran"]
    assert handed == [("decisions", 0, [b"pg:a"]), ("effects", 0, [b"e:a"]), ("decisions", 3, [b"pg:b"]),
                      ("effects", 3, [b"e:b"]), ("decisions", 7, [b"pg:c"])]
    assert kafka.log.index("sender ran") == len(handed)  # not before the last batch
    assert results == [[1, 2], [3, 4], [5]]  # each partition's acknowledgements, in order


def test_a_full_batch_continues_in_the_next_one_in_order() -> None:
    kafka = FakeKafka(room=2)

    async def scenario() -> None:
        producer = keyed(kafka)
        await (await producer.enqueue_all([("decisions", f"k{i}".encode(), b"v") for i in range(5)], partition=4))

    asyncio.run(scenario())
    assert kafka.log == [("decisions", 4, [b"k0", b"k1"]), ("decisions", 4, [b"k2", b"k3"]),
                         ("decisions", 4, [b"k4"])]
