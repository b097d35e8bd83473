"""The appender: one idempotent acks=all producer every request's append goes through (I/O shell)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest

from app.deadlines import Deadlines
from app.ingest.answers import Unavailable
from app.metrics import IngestMetrics
from app.producer import KeyedProducer

log = logging.getLogger("orderly.ingest")


class Appender:
    """An idempotent acks=all producer shared by every request, so concurrent appends batch."""

    def __init__(self, bootstrap: str, timeout_s: float, metrics: IngestMetrics, **client: Any) -> None:
        self.bootstrap = bootstrap
        self.client = client  # how to reach Kafka (app/kafka_client.py)
        self.timeout_s = timeout_s
        self.metrics = metrics
        self._producer: KeyedProducer | None = None
        self._starting: asyncio.Task[None] | None = None
        self.deadlines = Deadlines(timeout_s)
        self._expiring: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._starting = asyncio.create_task(self._keep_trying_to_start())
        self._expiring = asyncio.create_task(self.deadlines.run())

    async def _keep_trying_to_start(self) -> None:
        # The ingest comes up even when Kafka is down; until the producer starts it answers 503.
        delay = 0.2
        while self._producer is None:
            # No linger: under load the requests waiting while one produce request is in flight
            # make the next one's batch anyway. A 2 ms linger woke the sender to re-check lingering
            # batches on every append: measured side by side over 6 rounds, it cost the ingest 6-10 % more
            # CPU and the pipeline 0-15 % (median 10 %) of its webhooks/s (docs/benchmarks.md).
            producer = KeyedProducer(self.bootstrap, linger_ms=0,
                                     request_timeout_ms=max(1000, int(self.timeout_s * 1000)), **self.client)
            try:
                await producer.start()
            except KafkaError as exc:
                log.warning("kafka not reachable yet (%s); retrying in %.1fs", exc, delay)
                await producer.stop()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._producer = producer

    async def stop(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
        if self._expiring is not None:
            self._expiring.cancel()
        if self._producer is not None:
            await self._producer.stop()

    async def append(self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        started = time.perf_counter()
        producer = self._producer
        try:
            if producer is None or self._expiring is None or self._expiring.done():
                async with asyncio.timeout(self.timeout_s):
                    if self._producer is None and self._starting is not None:
                        await asyncio.shield(self._starting)  # still connecting: wait within the deadline
                    if self._producer is None:
                        raise Unavailable("kafka producer not connected")
                    await self._producer.send_and_wait(topic, key, value, headers)
            else:
                # Handing the record over waits only when aiokafka's buffer is full or the topic's
                # metadata is missing; the whole append waits at most until the deadline, which
                # self.deadlines keeps for every append in flight.
                task = asyncio.current_task()
                cancelling = task.cancelling() if task is not None else 0
                pending = self.deadlines.watch(asyncio.get_running_loop().time(), task)
                try:
                    pending.delivered = await producer.send(topic, key, value, headers)
                    await pending.delivered
                except asyncio.CancelledError:
                    # our own cancellation, as asyncio.timeout counts it: the deadline passed; one from
                    # outside as well (the ingest stopping) goes on as a cancellation
                    if not pending.expired or task is None or task.uncancel() > cancelling:
                        raise
                    raise TimeoutError from None
                finally:
                    pending.finished = True
        except (TimeoutError, KafkaError) as exc:
            self.metrics.append_failures.labels(topic).inc()
            raise Unavailable(f"kafka append failed: {type(exc).__name__}") from exc
        self.metrics.child(self.metrics.append_seconds, topic).observe(time.perf_counter() - started)

    async def probe(self, topic: str) -> None:
        """Ask a broker for ``topic``'s metadata now, over the producer's own connections.

        Not ``partitions_for``: that answers from cached metadata, so a stopped broker looked
        ready. Raises Unavailable (or a KafkaError) when no broker answers with the topic.
        """
        producer = self._producer
        if producer is None:
            raise Unavailable("kafka producer not connected")
        client = producer.producer.client
        # allow_auto_topic_creation=False: a probe must never create the topic it asks about
        request = MetadataRequest([topic], allow_auto_topic_creation=False)
        failures = []
        for broker in client.cluster.brokers():
            try:
                response = await client.send(broker.nodeId, request)
            except KafkaError as exc:
                failures.append(f"broker {broker.nodeId}: {type(exc).__name__}")
                continue
            answered = ClusterMetadata()
            answered.update_metadata(response)
            if not answered.partitions_for_topic(topic):
                raise Unavailable(f"kafka has no partitions for {topic}")
            return
        raise Unavailable(f"no kafka broker answered ({'; '.join(failures) or 'none known'})")
