"""One batch of orderly.raw decided: fresh records, plan, outputs, table, positions (I/O shell)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from aiokafka import TopicPartition
from faust.types import AppT, TableT

from app.core.dispatch import STAGE, BatchPlan, Incoming, Record, plan_batch
from app.gateways.registry import GATEWAYS
from app.liveness import Liveness
from app.logs import SampledLog
from app.metrics import WorkerMetrics
from app.producer import KeyedProducer, send_keyed
from app.seams.faust import Target, consumer_of, inside, producer_of, transactional_id
from app.worker.exits import FAILED_EXIT_CODE, SKIPPED_EXIT_CODE, OffsetGuard, exit_for_restart
from app.worker.shared import WorkerState
from app.worker.store import PartitionStore
from app.worker.transactions import TransactionStage
from topics.catalog import TopicNames

log = logging.getLogger("orderly.worker")
LOGGED_PER_MINUTE = 5  # lines per gateway and reason (decision errors, set-aside records)
# A Faust event of orderly.raw. Its key, value and headers are raw bytes (the topic's serialisers are
# "raw"), which Faust's EventT cannot say: it types them as any key or model.
Event = Any


def report(plan: BatchPlan, metrics: WorkerMetrics, sampled: SampledLog) -> None:
    """A batch's counts into the metrics, its decision errors and set-aside records into the log,
    sampled: one kind of bad input repeated writes a bounded number of lines a minute."""
    for decision in plan.errors:
        metrics.errors.labels(decision.gateway).inc()
        # parked or refused, not failed: the record is kept and its resource goes on
        sampled.log(logging.WARNING, ("decision", decision.gateway, str(decision.error)[:200]),
                    "%s %s: %s", decision.gateway, decision.resource_id, decision.error,
                    extra={"gateway": decision.gateway, "resource_id": decision.resource_id,
                           "delivery_id": decision.delivery_id})
    for gateway, reason in plan.set_aside:
        metrics.set_aside.labels(STAGE, gateway).inc()
        sampled.log(logging.ERROR, ("set_aside", gateway, str(reason)[:200]),
                    "a record was set aside to quarantine (%s): %s", gateway, reason, extra={"gateway": gateway})
    sampled.flush()
    for (gateway, outcome), count in plan.outcomes.items():
        metrics.decisions.labels(gateway, outcome).inc(count)
    for (gateway, kind), count in plan.effects.items():
        metrics.effects.labels(gateway, kind).inc(count)


class BatchProcessor:
    """Decides the batches the agent takes. The order inside a batch: with at-least-once, its
    outputs are sent and acknowledged by Kafka before the table is written, so any commit covers
    state whose outputs are already durable; a crash before the commit replays the batch, which
    re-emits the same records with the same keys, and every sink dedupes on them. With exactly-once
    its outputs and table values are staged for its source partition's transaction
    (TransactionStage), and sent into it as the batch ends. Either way the batch's offsets become
    committable only once that is done."""

    def __init__(self, app: AppT, state: WorkerState, table: TableT[bytes, bytes], n: TopicNames,
                 producer: KeyedProducer, liveness: Liveness, max_record_bytes: int) -> None:
        self.app = app
        self.state = state
        self.metrics = state.metrics
        self.table = table
        self.names = n
        self.producer = producer
        self.liveness = liveness
        self.max_record_bytes = max_record_bytes
        self.guard = OffsetGuard()
        # A decision's error or a set-aside record is one line per record: a signed sender (or a
        # broken gateway) repeating one kind of bad input writes a bounded number of lines a minute
        # per gateway and reason, then their count (orderly_log_lines_suppressed_total).
        self.sampled = SampledLog(log, first=LOGGED_PER_MINUTE, window_s=60.0,
                                  on_suppressed=lambda _key: self.metrics.log_suppressed.labels(log.name).inc())
        self.local = PartitionStore(table.data, n.changelog)
        self.stage = TransactionStage(n.changelog, self.changelog_producer, self.local, producer)

    async def handle(self, events: Sequence[Event]) -> None:
        """Decide the events not handed over before. A failure ends the process with nothing acked:
        the batch is decided again after the restart."""
        fresh = await self.fresh(events)
        try:
            if fresh:
                await self.decide(fresh)
        except Exception:  # a bug, not bad input (bad input is quarantined by the reducers)
            exit_for_restart(FAILED_EXIT_CODE, "the worker failed on a batch; exiting without acking it",
                             exc_info=True)

    async def fresh(self, events: Sequence[Event]) -> list[Event]:
        """The events to decide: those not handed over before, in order. Where records were skipped,
        their partition is fetched again from the first one skipped and its later events here are
        left for then; the process exits if that cannot be done (OffsetGuard)."""
        consumer = consumer_of(self.app)
        fresh, rewound, again_n = [], set(), 0
        for event in events:
            tp, offset = event.message.tp, event.message.offset
            if tp in rewound:
                continue  # handed over again after the rewind, in order
            committed = consumer.committed_offset(tp)
            start = await consumer.start_offset(tp) if self.guard.needs_start(tp, committed) else None
            again, first_skipped = self.guard.check(tp, offset, committed, start)
            earliest = None if first_skipped is None else await self.earliest(consumer, tp)
            if first_skipped is not None and (earliest is None or earliest < offset):
                # those deleted by retention meanwhile are not fetched again
                await self.rewind(consumer, tp, max(first_skipped, earliest or 0), offset)
                rewound.add(tp)
            elif again:
                again_n += 1
            else:
                fresh.append(event)
        if again_n:
            self.metrics.handed_again.inc(again_n)
        return fresh

    async def earliest(self, consumer: Any, tp: Any) -> int | None:
        """The earliest offset ``tp`` still holds (records before it were deleted by retention, not
        skipped); None if the broker could not say (all taken as skipped: they are fetched again)."""
        try:
            found: int | None = (await consumer.earliest_offsets(tp)).get(tp)
        except Exception:
            log.warning("could not read the earliest offset of %s[%d]", tp.topic, tp.partition, exc_info=True)
            return None
        return found

    async def rewind(self, consumer: Any, tp: Any, first_skipped: int, offset: int) -> None:
        """Records ``first_skipped`` .. ``offset`` - 1 never reached the worker (Faust dropped them at
        a rebalance): fetch ``tp`` again from ``first_skipped``. Nothing after them was decided, so
        no commit covers them meanwhile. Exits for a restart from the committed offsets when the
        consumer refuses or the partition keeps skipping (OffsetGuard.rewound)."""
        if self.guard.rewound(tp, first_skipped) and await consumer.rewind(tp, first_skipped):
            self.metrics.rewinds.inc()
            self.sampled.log(logging.WARNING, ("rewind", tp.topic), "records %s[%d] %d-%d were never handed to "
                             "the worker (Faust skipped them): fetching them again", tp.topic, tp.partition,
                             first_skipped, offset - 1)
            return
        exit_for_restart(SKIPPED_EXIT_CODE, "records %s[%d] %d-%d were never handed to the worker (Faust "
                         "skipped them) and could not be fetched again; exiting without acking, so that the "
                         "supervisor restarts it from the committed offsets", tp.topic, tp.partition,
                         first_skipped, offset - 1)

    async def decide(self, events: Sequence[Event]) -> None:
        """Plan the batch (app/core/dispatch.py), send or stage its outputs, write its table values,
        and only then let the next commit cover its offsets."""
        started = time.perf_counter()
        plan = plan_batch(self.names, GATEWAYS, [Incoming(e.key, e.value, e.message.headers or [], e.message.offset,
                                                e.message.partition, e.message.topic) for e in events],
                          self.read, self.max_record_bytes)
        self.report(plan)
        await self.emit(plan.records)
        await self.write_state(plan.states, {key: events[index] for key, index in plan.last.items()})
        self.advance(events)
        if self.app.in_transaction:
            self.stage.send()  # into the open transactions, unless a commit holds them
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        self.metrics.batch_size.observe(len(events))

    def read(self, partition: int, key: bytes) -> bytes | None:
        """A resource's state: exactly-once, the one not committed yet if any, else the table's."""
        stored = self.stage.get(partition, key)
        return stored if stored is not None else self.local.get(partition, key)

    def report(self, plan: BatchPlan) -> None:
        report(plan, self.metrics, self.sampled)

    async def emit(self, records: dict[int, list[Record]]) -> None:
        """The batch's outputs, per source partition."""
        if self.app.in_transaction:  # they go into the partition's transaction when it commits
            for partition, outputs in records.items():
                self.stage.stage_outputs(partition, outputs)
        else:  # durable before the state that implies them
            await (await self.producer.enqueue_partitioned(records))

    async def write_state(self, states: dict[bytes, bytes], last_event: dict[bytes, Event]) -> None:
        """Write the batch's new table values: the changelog records acknowledged by Kafka before
        the local store, with the changelog offset the store holds data up to (Faust reads the
        changelog from there on a restart). The changelog records must be in Kafka before the
        events' offsets are committed: a commit could otherwise cover offsets whose state is lost
        with the process (seen here: reversals applied twice). With exactly-once they are staged
        and go into the partition's transaction when it commits (TransactionStage)."""
        by_partition: dict[int, list[bytes]] = {}
        for key in states:
            by_partition.setdefault(last_event[key].message.partition, []).append(key)
        faust_path = False
        sent: list[tuple[int, Awaitable[int]]] = []
        for partition, keys in by_partition.items():
            target = self.changelog_producer(partition)
            if target is None:  # mid-rebalance: Faust's own path, which knows what to do
                faust_path = True
                for key in keys:
                    with inside(last_event[key]):
                        self.table[key] = states[key]
            elif self.app.in_transaction:  # staged: into the partition's transaction, and the store once it commits
                for key in keys:
                    self.stage.stage(partition, key, states[key])
            else:
                kafka, lock = target
                sent.append((partition, await send_keyed(kafka, lock, (self.names.changelog, partition),
                                                         ((key, states[key]) for key in keys))))
        for partition, acknowledged in sent:
            last = await acknowledged  # the store itself: its changelog records are in Kafka
            self.local.write(partition, ((key, states[key]) for key in by_partition[partition]), last)
        if faust_path:
            await self.app.producer.flush()

    def advance(self, events: Sequence[Event]) -> None:
        """What the next commit may cover. Exactly-once: in the same step as the staging above, so
        that a commit takes a batch's writes and its offsets together or neither."""
        decided = {TopicPartition(e.message.topic, e.message.partition): e.message.offset for e in events}
        positions = self.state.decided
        for tp, offset in decided.items():
            positions[tp] = max(positions.get(tp, 0), offset + 1)
        self.liveness.on_batch(decided)

    def changelog_producer(self, partition: int) -> Target | None:
        """The producer (and its lock) that writes a changelog partition, as Faust picks it: with
        exactly-once, the transactional producer of the partition's task, which commits the
        changelog with the consumed offsets; None if this worker holds no transaction for it."""
        if not self.app.in_transaction:
            return self.producer.producer, contextlib.nullcontext()
        return producer_of(self.app).transactional(transactional_id(self.app, self.names.changelog, partition))

    def assigned(self, tps: set[Any]) -> None:
        """A new assignment starts at the committed offsets."""
        self.guard.forget(tps)
        for tp in tps:
            self.state.decided.pop(tp, None)

    def revoked(self, partitions: set[int]) -> None:
        """The staged writes and the decided offsets of revoked partitions go together: a commit
        between the revocation and the next assignment (Faust's timer runs on) must not commit
        the offsets of records whose outputs were dropped (exactly-once: they would be skipped)."""
        self.stage.revoked(partitions)
        for tp in [tp for tp in self.state.decided if tp.partition in partitions]:
            del self.state.decided[tp]
