"""The table's start: the exact end of Faust's recovery, read from the changelogs (I/O shell).

Two things in Faust's own start cost every worker start seconds, and one of them can lose state:

- Its TableManager waits a fixed second at start for tables to be registered; the worker registers
  its one table before the app starts (app/worker/app.py), so there is nothing to wait for
  (app/seams/faust/tables.py's WorkerTableManager skips it).
- With exactly-once, Faust takes a changelog partition's highwater from the last stable offset its
  consumer has cached from a fetch, minus one. The offset before the last stable one is a
  transaction's commit marker, never a record, so recovery cannot reach it: it waits for two idle
  5 s reads and then gives up on the gap (10 s on every start and takeover). And before the
  consumer's first fetch of the partition there is no cached offset at all: the highwater is -1 and
  a worker with an empty store (a new worker, a takeover) would skip recovery and decide on empty
  state; after a fetch the cached value can be stale, which ends in Faust's ConsistencyError.

Here (``exact_highwaters``, which app/seams/faust/tables.py's ExactRecovery asks for) the
highwater of each changelog partition is asked of the broker: the offset of its last
committed record, read with read_committed from the tail of the partition below its last stable
offset. Recovery then ends the moment the table holds that record.

The read is bounded (``read_timeout``): Faust runs it under its own timeout, and when that passes
its recovery loop ends for good with the worker still "in recovery" (alive, deciding nothing, its
stall watchdog held off); a changelog partition without a leader would leave the worker so. Past
the bound the worker exits (code 3) for its supervisor to start it again.

A partition whose local store is ahead of the last committed record read (its persisted offset is
higher) is read again for a moment: the transaction coordinator answers a commit before it has
written the commit markers, so right after a commit (a rebalance that keeps the partition commits
on revoke) the last stable offset can still be before the transaction the store already holds,
and Faust's consistency check would end the worker with ConsistencyError.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.types import TP

from app.worker.exits import STALLED_EXIT_CODE, exit_for_restart

log = logging.getLogger("orderly.worker")

TAIL = 64  # records read back from a partition's end to find its last committed record; then 16x more
READ_TIMEOUT_S = 30.0  # the highwater read of a recovery, at most (less than Faust's wait for it)
MARKERS_S = 5.0  # how long a partition whose store is ahead of the read is read again (commit markers)
MARKERS_EVERY_S = 0.05


class HighwaterTimeout(Exception):
    """The broker did not let the last committed records be read in time."""


def read_timeout(faust_timeout: float) -> float:
    """The bound of the highwater read, within Faust's timeout for the step (broker_request_timeout)."""
    return min(READ_TIMEOUT_S, faust_timeout / 2)


async def wait_stable(bootstrap: str, tps: list[TopicPartition], reader: AIOKafkaConsumer, **options: Any) -> None:
    """Until no open transaction holds records of ``tps``: their last stable offsets (``reader``
    reads read_committed) reach their end offsets. With one transaction per worker, nothing else
    orders a new owner's recovery after the previous owner's last commit has written its markers
    into the changelog (a transaction per partition: the new owner's producer, under the same id,
    waits for them); a transaction left open by a worker gone for good ends at its timeout."""
    ends = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted",
                            enable_auto_commit=False, auto_offset_reset="none", **options)
    await ends.start()
    try:
        while True:
            stable, end = await reader.end_offsets(tps), await ends.end_offsets(tps)
            open_ = [tp for tp in tps if stable[tp] < end[tp]]
            if not open_:
                return
            log.info("changelog partitions with an open transaction, waited for before recovery: %s",
                     ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(open_)))
            await asyncio.sleep(MARKERS_EVERY_S * 4)
    finally:
        await ends.stop()


async def last_committed_offsets(bootstrap: str, partitions: Iterable[TP], *, timeout_s: float = READ_TIMEOUT_S,
                                 floor: Mapping[TP, int | None] | None = None, stable_first: bool = False,
                                 **options: Any) -> dict[TP, int]:
    """The offset of the last committed record of each partition, -1 for none (read_committed).

    A partition whose result is below its ``floor`` (the offset the local store says it holds) is
    read again for up to MARKERS_S: the commit markers of a transaction that just committed may not
    be written yet. Raises HighwaterTimeout past ``timeout_s``, naming the partitions not read."""
    tps = {TopicPartition(tp.topic, tp.partition): tp for tp in partitions}
    if not tps:
        return {}
    last = {tp: -1 for tp in tps}
    done: set[TopicPartition] = set()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                enable_auto_commit=False, auto_offset_reset="none",
                                request_timeout_ms=int(timeout_s * 1000), **options)
    try:
        async with asyncio.timeout(timeout_s):
            await consumer.start()
            consumer.assign(list(tps))
            if stable_first:
                await wait_stable(bootstrap, list(tps), consumer, **options)
            wanted = {tp: (floor or {}).get(faust_tp) for tp, faust_tp in tps.items()}
            settle_until = time.monotonic() + MARKERS_S
            todo = set(tps)
            while True:
                found = await _read_once(consumer, todo)
                last.update(found)
                done |= todo
                todo = {tp for tp in todo if (want := wanted[tp]) is not None and last[tp] < want}
                if not todo or time.monotonic() >= settle_until:
                    break
                await asyncio.sleep(MARKERS_EVERY_S)
            for tp in todo:
                log.warning("changelog %s[%d]: the local store holds offset %s, the last committed record read is %d",
                            tp.topic, tp.partition, wanted[tp], last[tp])
    except TimeoutError:
        missing = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps) if tp not in done) or "none"
        raise HighwaterTimeout(f"the last committed records of the changelog were not read within {timeout_s:.0f} s "
                               f"(partitions not read: {missing})") from None
    finally:
        await consumer.stop()
    return {tps[tp]: offset for tp, offset in last.items()}


async def _read_once(consumer: AIOKafkaConsumer, tps: set[TopicPartition]) -> dict[TopicPartition, int]:
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
    return last


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


async def exact_highwaters(bootstrap: str, options: Mapping[str, Any], tps: set[TP], held: Mapping[TP, int | None],
                          *, active: bool, faust_timeout_s: float, title: str) -> dict[TP, int]:
    """Exactly-once: the highwater of each changelog partition in ``tps`` for Faust's recovery (the
    seam's ExactRecovery asks), given the offsets the local stores hold (``held``); the worker exits
    if the broker does not let them be read in time. ``active``: active partitions, whose previous
    owner's open transactions are waited for (a standby's changelog is a live worker's, always in one)."""
    try:
        return await last_committed_offsets(bootstrap, tps, timeout_s=read_timeout(faust_timeout_s), floor=held,
                                            stable_first=active, **options)
    except HighwaterTimeout as exc:
        exit_for_restart(STALLED_EXIT_CODE, "recovery of the %s changelog partitions stalled: %s; exiting so that "
                         "the supervisor restarts this worker", title, exc)
        raise
