"""A keyed, idempotent acks=all Kafka producer shared by Orderly's processes (I/O layer).

It picks each record's partition itself with Kafka's default murmur2 (topics/partitioning.py):
every topic keyed by ``gateway:resource_id`` then agrees on the partition, and the per-message
cost is less than half of aiokafka's own partitioner path (measured in bench/ingest.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer

from topics.catalog import REQUEST_BYTES
from topics.partitioning import partition_for

Headers = list[tuple[str, bytes]]
OutRecord = tuple[str, bytes, bytes] | tuple[str, bytes, bytes, Headers]  # topic, key, value[, headers]


class KeyedProducer:
    def __init__(self, bootstrap: str, *, linger_ms: int = 2, request_timeout_ms: int = 30_000,
                 **extra: Any) -> None:
        self._config = dict(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=linger_ms,
            request_timeout_ms=request_timeout_ms, max_batch_size=256 * 1024,
            max_request_size=REQUEST_BYTES, **extra)
        self._producer: AIOKafkaProducer | None = None
        self._partitions: dict[str, int] = {}

    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("KeyedProducer used before start()")
        return self._producer

    async def start(self) -> None:
        """Start once; a second call is a no-op."""
        if self._producer is not None:
            return
        # Built here, not in __init__: aiokafka binds to the running event loop.
        producer = AIOKafkaProducer(**self._config)
        await producer.start()
        self._producer = producer

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()

    async def partition(self, topic: str, key: bytes) -> int:
        count = self._partitions.get(topic)
        if count is None:
            count = self._partitions[topic] = len(await self.producer.partitions_for(topic))
        return partition_for(key, count)

    async def send(self, topic: str, key: bytes, value: bytes, headers: Headers | None = None) -> asyncio.Future[Any]:
        """Enqueue one record; the returned future resolves when Kafka acknowledged it."""
        count = self._partitions.get(topic)  # known after the first record: no coroutine for it
        partition = partition_for(key, count) if count else await self.partition(topic, key)
        future: asyncio.Future[Any] = await self.producer.send(
            topic, value, key=key, headers=headers, partition=partition)
        return future

    async def send_and_wait(self, topic: str, key: bytes, value: bytes, headers: Headers | None = None) -> Any:
        # send()'s body inline: the ingest calls this once per request
        count = self._partitions.get(topic)
        partition = partition_for(key, count) if count else await self.partition(topic, key)
        return await (await self.producer.send(topic, value, key=key, headers=headers, partition=partition))

    async def send_all(self, records: Sequence[OutRecord]) -> None:
        """Send every record (topic, key, value[, headers]) and wait until Kafka acknowledged all of them."""
        await (await self.enqueue_all(records))

    async def enqueue_partitioned(self, by_partition: Mapping[int, Sequence[OutRecord]]) -> Awaitable[Any]:
        """Hand over each partition's records to that partition of their topics (the worker's rule:
        every output about a resource goes to the resource's partition, so a batch touches one
        partition per topic and source partition, not every partition of the effects and facts);
        the returned awaitable completes when Kafka acknowledged all of them."""
        acks = [await self.enqueue_all(records, partition=partition) for partition, records in by_partition.items()]
        return asyncio.gather(*acks)

    async def enqueue_all(self, records: Sequence[OutRecord],
                          via: AIOKafkaProducer | None = None, partition: int | None = None) -> Awaitable[Any]:
        """Hand every record (topic, key, value[, headers]) to the producer (or to ``via``, e.g. a
        transactional producer), to ``partition`` of its topic or else to its key's; the returned
        awaitable completes when Kafka acknowledged all of them (await it, or the errors go unseen).

        Records are packed into one aiokafka batch per topic-partition (in list order) instead of
        a send per record: a worker batch is a few thousand records, and the per-record path
        (a future, a metadata check and an accumulator lookup each) was a tenth of its CPU."""
        producer = via or self.producer
        builders: dict[tuple[str, int], list[Any]] = {}
        for topic, key, value, *headers in records:
            if partition is not None:
                tp = (topic, partition)
            else:
                count = self._partitions.get(topic)
                tp = (topic, partition_for(key, count) if count else await self.partition(topic, key))
            chain = builders.get(tp)
            if chain is None:
                chain = builders[tp] = [producer.create_batch()]
            append(producer, chain, key, value, headers[0] if headers else [])
        # One after the other, not gathered in tasks: handing over a batch does not suspend unless the
        # topic-partition still has one waiting to be sent, so every batch of this call (and of the
        # caller's next calls, e.g. enqueue_partitioned's other partitions) is queued before the sender
        # runs, and goes in one produce request instead of one per task switch.
        futures = [f for tp, chain in builders.items() for f in await enqueue(producer, tp, chain)]
        return asyncio.gather(*futures)


def append(producer: AIOKafkaProducer, chain: list[Any], key: bytes, value: bytes, headers: Headers) -> None:
    """Append a record to the last batch of ``chain`` (one topic-partition's batches), or to a new one."""
    if chain[-1].append(key=key, value=value, timestamp=None, headers=headers) is None:  # that batch is full
        chain.append(producer.create_batch())
        if chain[-1].append(key=key, value=value, timestamp=None, headers=headers) is None:
            raise ValueError("a record does not fit in an empty batch")


async def enqueue(producer: AIOKafkaProducer, tp: tuple[str, int], chain: list[Any]) -> list[asyncio.Future[Any]]:
    """Hand one topic-partition's batches to ``producer`` in order (aiokafka queues the next only
    once the previous drained); each future resolves to the batch's RecordMetadata (its base offset)."""
    return [await producer.send_batch(builder, tp[0], partition=tp[1]) for builder in chain]


async def send_keyed(producer: AIOKafkaProducer, lock: Any, tp: tuple[str, int],
                     items: Iterable[tuple[bytes, bytes]]) -> Awaitable[int]:
    """Hand (key, value) records for one topic-partition to ``producer`` as whole batches, under
    ``lock`` (a transactional producer's); the returned awaitable resolves, once Kafka acknowledged
    them all, to the offset of the last record."""
    chain = [producer.create_batch()]
    for key, value in items:
        append(producer, chain, key, value, [])
    async with lock:
        futures = await enqueue(producer, tp, chain)

    async def last_offset() -> int:
        return int((await asyncio.gather(*futures))[-1].offset + chain[-1].record_count() - 1)

    return last_offset()
