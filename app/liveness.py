"""Liveness for the worker: a worker that has stopped deciding while records wait for it exits,
so that its supervisor (systemd, Kubernetes, `orderly dev`) starts it again (I/O shell).

Why: Faust can leave an agent waiting forever after a consumer-group rebalance (faust-streaming
issues #323 and #678; reproduced here by tests/chaos/test_pipeline_chaos.py with two workers, one
killed). A restarted worker recovers its state from RocksDB or the changelog and resumes from the
committed offsets, which is correct by design; a silent stall is not.

Stalled means: on some assigned partition of orderly.raw there are records
past the group's committed offset, that offset has not moved for ``stall_s``, and either no batch
was decided for ``stall_s`` or this worker has decided past the committed offset (Faust can skip a
record after a rebalance and then never commit past it). An idle worker is never stalled.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from app.waits import within

log = logging.getLogger("orderly.liveness")


class Liveness:
    def __init__(self, bootstrap: str, group_id: str, stall_s: float, **client: Any) -> None:
        self.bootstrap = bootstrap
        self.client = client  # how to reach Kafka (app/kafka_client.py)
        self.group_id = group_id
        self.stall_s = stall_s
        self.assigned: set[TopicPartition] = set()
        self.next_offset: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, tuple[int, float]] = {}  # offset, since when
        self.last_progress = time.monotonic()
        self.batches = 0  # since the last assignment
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None

    def on_assigned(self, partitions: set[TopicPartition]) -> None:
        self.assigned = set(partitions)
        self.batches = 0
        self.committed.clear()
        self.last_progress = time.monotonic()  # a rebalance is progress: the clocks start again

    def on_batch(self, decided: dict[TopicPartition, int]) -> None:
        """``decided``: the highest offset decided in the batch, per partition."""
        for tp, offset in decided.items():
            self.next_offset[tp] = offset + 1
        self.batches += 1
        self.last_progress = time.monotonic()

    def quiet_for(self) -> float:
        return time.monotonic() - self.last_progress

    async def stalled(self) -> dict[TopicPartition, int]:
        """Stalled partitions -> records waiting past the committed offset ({} when all is well)."""
        tps = sorted(self.assigned)
        if not tps or self.quiet_for() < self.stall_s:
            return {}
        consumer, admin = await self._clients()
        try:
            ends = await consumer.end_offsets(tps)
            offsets = await admin.list_consumer_group_offsets(self.group_id, partitions=tps)
        except KafkaError as exc:  # the broker or the coordinator is away: not a stall of ours
            log.info("liveness check skipped: %r", exc)
            return {}
        # Restoring a table (a million resources took 85-150 s here) is not counted: the worker's
        # watchdog restarts the clock while Faust recovers, and its timers start only after the
        # first recovery. Before the first batch after an assignment, twice the allowance (the
        # producers start, the record limit is read); not more: Faust can leave the agent waiting
        # for ever after a rebalance, and ten times the limit kept such a worker idle 10 minutes.
        allowance = self.stall_s if self.batches else 2 * self.stall_s
        now, quiet, stuck = time.monotonic(), self.quiet_for() >= allowance, {}
        for tp in tps:
            committed = offsets[tp].offset if tp in offsets and offsets[tp].offset >= 0 else 0
            if self.committed.get(tp, (None, 0.0))[0] != committed:
                self.committed[tp] = (committed, now)
            unmoved_for = now - self.committed[tp][1]
            if ends[tp] > committed and unmoved_for >= allowance and (
                    quiet or self.next_offset.get(tp, 0) > committed):
                stuck[tp] = ends[tp] - committed
        return stuck

    async def _clients(self) -> tuple[AIOKafkaConsumer, AIOKafkaAdminClient]:
        """Built and started together, kept only once both started: a start that failed or was
        cancelled (Kafka away, a deadline) leaves nothing half-started behind, so the next call
        tries again (a kept half-started client answered "Unable to get cluster metadata" for ever,
        and the stall check with it)."""
        if self._consumer is None or self._admin is None:
            consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False, **self.client)
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self.client)
            try:
                await consumer.start()
                await admin.start()
            except BaseException:
                await _quietly(consumer.stop(), admin.close())
                raise
            self._consumer, self._admin = consumer, admin
        return self._consumer, self._admin

    async def group_lag(self, topic: str) -> int:
        """Records of ``topic`` past the group's committed offsets, over every partition (not only
        this worker's: each worker of the group reports the whole group's lag, the admin's figure)."""
        consumer, admin = await self._clients()
        await consumer.topics()  # fresh metadata: the topic's partitions
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        ends = await consumer.end_offsets(tps)
        offsets = await admin.list_consumer_group_offsets(self.group_id, partitions=tps)
        return sum(ends[tp] - (offsets[tp].offset if tp in offsets and offsets[tp].offset >= 0 else 0) for tp in tps)

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        if self._admin is not None:
            await self._admin.close()


async def _quietly(*closing: Awaitable[object]) -> None:
    """Close what may have started, ignoring its errors (it is being given up), within a deadline."""
    for close in closing:
        with contextlib.suppress(Exception):
            await within(close, 5)
