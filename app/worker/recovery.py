"""The table's start: Faust's TableManager and Recovery, with an exact end of recovery (I/O shell).

Two things in Faust's own start cost every worker start seconds, and one of them can lose state:

- Its TableManager waits a fixed second at start for tables to be registered; the worker registers
  its one table before the app starts (app/worker/app.py), so there is nothing to wait for.
- With exactly-once, Faust takes a changelog partition's highwater from the last stable offset its
  consumer has cached from a fetch, minus one. The offset before the last stable one is a
  transaction's commit marker, never a record, so recovery cannot reach it: it waits for two idle
  5 s reads and then gives up on the gap (10 s on every start and takeover). And before the
  consumer's first fetch of the partition there is no cached offset at all: the highwater is -1 and
  a worker with an empty store (a new worker, a takeover) would skip recovery and decide on empty
  state; after a fetch the cached value can be stale, which ends in Faust's ConsistencyError.

Here the highwater of each changelog partition is asked of the broker: the offset of its last
committed record, read with read_committed from the tail of the partition below its last stable
offset. Recovery then ends the moment the table holds that record.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP

log = logging.getLogger("orderly.worker")

TAIL = 64  # records read back from a partition's end to find its last committed record; then 16x more


async def last_committed_offsets(bootstrap: str, partitions: Iterable[TP], **options: Any) -> dict[TP, int]:
    """The offset of the last committed record of each partition, -1 for none (read_committed)."""
    tps = {TopicPartition(tp.topic, tp.partition): tp for tp in partitions}
    if not tps:
        return {}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                enable_auto_commit=False, auto_offset_reset="none", **options)
    await consumer.start()
    try:
        consumer.assign(list(tps))
        stable = await consumer.end_offsets(list(tps))  # read_committed: the last stable offsets
        earliest = await consumer.beginning_offsets(list(tps))
        last = {tp: -1 for tp in tps}
        window = dict.fromkeys(tps, TAIL)
        # read each partition from `window` records before its end; a partition whose tail held no
        # committed record (aborted transactions only) is read again from further back
        todo = {tp for tp in tps if stable[tp] > earliest[tp]}
        while todo:
            starts = {tp: max(earliest[tp], stable[tp] - window[tp]) for tp in todo}
            for tp, start in starts.items():
                consumer.seek(tp, start)
            await read_to(consumer, todo, stable, last)
            todo = {tp for tp in todo if last[tp] < 0 and starts[tp] > earliest[tp]}
            for tp in todo:
                window[tp] *= 16
        return {tps[tp]: offset for tp, offset in last.items()}
    finally:
        await consumer.stop()


async def read_to(consumer: AIOKafkaConsumer, partitions: set[TopicPartition], stable: Mapping[TopicPartition, int],
                  last: dict[TopicPartition, int]) -> None:
    """Read ``partitions`` from their positions to their last stable offsets, noting each one's last
    record in ``last`` (the consumer passes commit markers and aborted records by)."""
    pending = set(partitions)
    while pending:
        fetched = await consumer.getmany(*pending, timeout_ms=500)
        for tp, records in fetched.items():
            if records:
                last[tp] = max(last[tp], records[-1].offset)
        for tp in list(pending):
            if await consumer.position(tp) >= stable[tp]:
                pending.discard(tp)


class ExactRecovery(Recovery):
    async def _build_highwaters(self, consumer: Any, tps: set[TP], destination: Counter[TP], title: str) -> None:
        if not self.app.in_transaction:  # at-least-once: the log's end offset, as Faust reads it, is exact
            await super()._build_highwaters(consumer, tps, destination, title)
            return
        bootstrap, options = self.app.kafka_client  # type: ignore[attr-defined]  # WorkerApp's
        highwaters = await last_committed_offsets(bootstrap, tps, **options)
        self.log.info("Highwater for %s changelog partitions (last committed records): %s", title,
                      ", ".join(f"{tp.topic}[{tp.partition}]={offset}" for tp, offset in sorted(highwaters.items())))
        destination.clear()
        destination.update(highwaters)


class WorkerTableManager(TableManager):
    async def on_start(self) -> None:
        if not self.should_stop:  # no fixed second's wait for tables: the worker's is registered
            await self._update_channels()
            await self.recovery.start()

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = ExactRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery
