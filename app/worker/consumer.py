"""The worker's Kafka consumer: commits paced by load, the offsets it decided, fetches sized by load (I/O shell)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka import TopicPartition
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, AppT, Message
from mode import Service, ServiceT

from app.core.pacing import BUSY_BATCH
from app.worker import fencing
from app.worker.exits import FAILED_EXIT_CODE, exit_for_restart
from app.worker.shared import worker_state
from app.worker.transactions import worker_transactional_id

# Faust fixes the consumer's fetch wait at 1,500 ms. aiokafka keeps one fetch in flight per broker
# and leaves out the partitions whose records are still buffered or paused (Faust pauses them for
# flow control), so a fetch sent at such a moment asks only for quiet partitions and the broker
# holds it the whole wait: orderly.raw is not read meanwhile, and no batch is taken while the
# ingest appends.
FETCH_MAX_WAIT_MS = 100
# Under load the fetches grow as well: after a busy batch the worker's fetches ask the broker for at
# least this much (or FETCH_MAX_WAIT_MS), after a small one for any record at all. Asking for any
# record while the ingest appends thousands a second returns a fetch per few records, each costing
# the worker's consumer thread and the broker a request for every partition.
BUSY_FETCH_MIN_BYTES = 256 * 1024

# Commits adapt to load the way batches do (app/core/pacing.py): after a commit that covered
# BUSY_COMMIT_RECORDS records or more, the next one comes after the busy commit interval
# (ORDERLY_BUSY_COMMIT_INTERVAL_S) instead of the commit interval, or as soon as the worker has been
# idle for the quiet time (no batch taken or finished: the flow stopped, and its tail is not held
# back). With exactly-once every commit is a transaction per partition with new records, and the
# projector sees a decision only once its transaction commits: at low load short commit intervals
# keep the latency down; under load, commits that each cover hundreds of records spare the broker
# most of the transactions.
BUSY_COMMIT_RECORDS = 250
QUIET_MARGIN_S = 0.05  # the quiet time is longer than a busy worker's pause between batches by this
DRAIN_YIELD_EVERY = 100  # the fetch loop lets other tasks run after this many records (as Faust's does)
START_OFFSET_TIMEOUT_S = 5.0  # the skip guard's question to the broker (ask_start_offset), at most


def quiet_after(busy_interval: float) -> float:
    """How long without a batch means the flow stopped, for a worker pausing ``busy_interval`` between busy batches."""
    return busy_interval + QUIET_MARGIN_S


def next_commit_wait(covered: int, interval: float, busy_interval: float) -> float:
    """Seconds from the end of a commit that covered ``covered`` records to the next commit."""
    return busy_interval if covered >= BUSY_COMMIT_RECORDS else interval


def commit_due(since_commit: float, wait: float, since_batch: float, quiet: float) -> bool:
    """Whether to commit now, ``since_commit`` seconds after the last commit with ``wait`` chosen
    for the next, and ``since_batch`` seconds after a batch was last taken or finished."""
    return since_commit >= wait or since_batch >= quiet


def fetch_min_bytes(batch_size: int) -> int:
    """What the worker's next fetches wait for, given the size of the batch it just decided."""
    return BUSY_FETCH_MIN_BYTES if batch_size >= BUSY_BATCH else 1


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read when the consumer starts
        return consumer

    def set_fetch_min_bytes(self, value: int) -> None:
        """Applies from the next fetch request: aiokafka's fetcher reads it for each one (a plain
        attribute, so setting it from the agent's thread is safe)."""
        fetcher = getattr(self._consumer, "_fetcher", None)  # there once the consumer started
        if fetcher is not None:
            fetcher._fetch_min_bytes = value


class _Consumer(faust_aiokafka.Consumer):
    last_commit_covered = 0  # records the last commit covered (set by _commit_offsets)

    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def set_fetch_min_bytes(self, value: int) -> None:
        if isinstance(self._thread, _ConsumerThread):
            self._thread.set_fetch_min_bytes(value)

    def delivers_at_once(self, tp: TP) -> bool:
        """Whether handing a record of ``tp`` to the conductor cannot wait: the flow runs, no
        subscription change holds the conductor, Faust's producer buffer is not over its limit and
        no queue of the partition's channels is full. Only then may the fetch loop await the
        hand-over itself; otherwise it must give it up when the flow stops (a rebalance clears the
        queues, and a hand-over finished after that would deliver a record of a revoked partition)."""
        app = self.app
        conductor: Any = app.topics
        if self.suspend_flow.is_set() or not app.flow_control.is_active() or conductor._tp_to_callback_lock.locked():
            return False
        buffer = app.producer.buffer
        if buffer.size > buffer.max_messages:
            return False
        return not any(channel.queue.full() for channel in conductor._tp_index.get(tp, ()))

    async def _drain_messages(self, fetcher: ServiceT) -> None:  # pragma: no cover  # Faust's thread-side loop
        """Faust's fetch loop (faust/transport/consumer.py), handing a record over directly when that
        cannot wait (delivers_at_once). Faust races every hand-over against the flow's suspension in
        ``wait_first``: four tasks and an ``asyncio.wait`` per record, a tenth of the worker's CPU
        under load. Records whose hand-over could wait still go that way."""
        callback = self.callback
        read_offset = self._read_offset
        acks_enabled_for = self.app.topics.acks_enabled_for
        consumer_stopped, fetcher_stopped = self._stopped.is_set, fetcher._stopped.is_set  # type: ignore[attr-defined]
        since_yield = 0
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                self.diag.set_flag(faust_consumer.CONSUMER_FETCHING)
                records = self.getmany(timeout=1.0)
                await self.sleep(0)  # getmany may return at once, again and again
                if not self.should_stop:
                    async for tp, message in records:
                        since_yield += 1
                        if since_yield > DRAIN_YIELD_EVERY:
                            await asyncio.sleep(0)
                            since_yield = 0
                        await self._hand_over(tp, message, read_offset.get(tp), callback, acks_enabled_for)
                self.diag.unset_flag(faust_consumer.CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if not self.transport.app.should_stop:
                raise
            self.log.info("Broker stopped consumer, shutting down...")
        except asyncio.CancelledError:
            if not self.transport.app.should_stop:
                raise
            self.log.info("Consumer shutting down for user cancel.")
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(faust_consumer.CONSUMER_FETCHING)

    async def _hand_over(self, tp: TP, message: Message, read: int | None, callback: Any,
                         acks_enabled_for: Any) -> None:
        offset = message.offset
        if read is not None and offset < read:
            return  # handed over before (Faust drops it the same way)
        if read and offset - read > 1 and acks_enabled_for(message.topic):
            await self._add_gap(tp, read + 1, offset)
        if self._commit_every is not None and self._n_acked >= self._commit_every:
            self._n_acked = 0
            await self.commit()
        if self.delivers_at_once(tp):
            await callback(message)
        else:
            await self.wait_first(callback(message), self.suspend_flow.wait())
        self._read_offset[tp] = offset

    def committed_offset(self, tp: TP) -> int | None:
        """Where ``tp`` was last committed or sought to by Faust (None: not known yet)."""
        return self._committed_offset.get(tp)

    async def start_offset(self, tp: TP) -> int | None:
        """Where the consumer began reading ``tp`` in this assignment, asked of the broker (on
        Faust's consumer thread, where aiokafka's consumer runs): see ``ask_start_offset``. None if
        the broker could not say within START_OFFSET_TIMEOUT_S (the caller then takes the first
        record as the start)."""
        thread = self._thread
        try:
            start: int | None = await thread.call_thread(ask_start_offset, thread._ensure_consumer(), tp)
            return start
        except Exception as exc:  # a guard, not a step the batch depends on
            self.log.warning("could not ask where %s[%d] starts: %r", tp.topic, tp.partition, exc)
            return None

    @Service.task
    async def _commit_handler(self) -> None:
        """Faust's commit timer (a fixed interval), with the wait chosen after each commit."""
        interval = self.commit_interval
        state = worker_state(self.app)
        busy_interval = state.busy_commit_interval if state is not None else interval
        await self.sleep(interval)
        while not self.should_stop:
            await self.commit()
            committed_at = time.monotonic()
            covered, self.last_commit_covered = self.last_commit_covered, 0
            wait = next_commit_wait(covered, interval, busy_interval)
            if state is not None:
                state.metrics.commit_wait.set(wait)
            await self.sleep(interval)
            while not self.should_stop:
                now = time.monotonic()
                if state is None or commit_due(now - committed_at, wait, now - state.last_batch_at, state.quiet_s):
                    break
                await self.sleep(min(interval, committed_at + wait - now))

    def _new_offset(self, tp: TP) -> int | None:
        """The offset to commit: the one after the last record the worker decided (at-least-once:
        its outputs acknowledged and the table written; exactly-once: staged for the partition's
        transaction). Faust's own answer, from its list of acks, fell behind what was decided when
        records were handed over during recovery and again after its seek: a commit then carried
        the outputs of records it did not cover."""
        state = worker_state(self.app)
        if state is None:
            return super()._new_offset(tp)
        self._acked[tp].clear()  # Faust's ack lists only say which partitions have news
        self._acked_index[tp].clear()
        return state.decided.get(tp)

    async def _commit_offsets(self, offsets: Any, start_new_transaction: bool = True) -> bool:
        """With exactly-once, the batches' writes are all in the partitions' open transactions and
        acknowledged first, and each committed partition's values reach the local store once they
        commit. The offsets are taken again in the same step as the flush starts holding new
        writes back: a batch decided since Faust chose them is in both or in neither. A partition
        revoked during the flush is left out: a send may have skipped its writes."""
        started = time.perf_counter()
        state = worker_state(self.app)
        stage = state.stage if state is not None else None
        before = dict(self._committed_offset)
        if state is None or stage is None or not self.in_transaction:
            did_commit = bool(await super()._commit_offsets(offsets, start_new_transaction))
        else:
            offsets = {tp: offset for tp, offset in state.decided.items() if self._should_commit(tp, offset)}
            # in the same step: the group membership these offsets belong to (app/worker/fencing.py)
            state.commit_membership = membership = fencing.coordinator_membership(_coordinator(self.app))
            try:
                if offsets and membership.generation != state.assigned_generation:
                    # Faust skipped the revocation (it was stopping, or its handler failed): the decided
                    # offsets are of an assignment of another generation than the one they would carry
                    raise fencing.FencedMemberError(
                        f"offsets decided in generation {state.assigned_generation} of the group, which is at "
                        f"{membership.generation} now")
                revoked = await stage.flush()  # sends the held writes before it first waits, and holds new ones
                offsets = {tp: offset for tp, offset in offsets.items() if tp.partition not in revoked}
                if worker_transactional_id(self.app) is not None:
                    # one transaction for every partition: it must not commit the writes of a partition
                    # whose offset it leaves out (Faust drops the offsets of partitions not assigned)
                    assigned_now = {tp.partition for tp in offsets if tp in self.assignment()}
                    if not stage.written <= assigned_now:
                        raise fencing.FencedMemberError(
                            f"the open transaction holds writes of partitions {sorted(stage.written - assigned_now)} "
                            "whose offsets this commit would not carry")
                did_commit = bool(offsets) and bool(await super()._commit_offsets(offsets, start_new_transaction))
            except Exception:
                # Faust would crash the app, and its stop commits once more: the offsets of the batches
                # whose writes just failed, without those writes (and the store would take their values).
                exit_for_restart(FAILED_EXIT_CODE, "an exactly-once commit failed: exiting without committing "
                                 "again, so that the supervisor restarts this worker (the open transactions are "
                                 "aborted, their records decided again)", exc_info=True)
            if did_commit:
                assigned = self.assignment()
                stage.committed({tp.partition for tp in offsets if tp in assigned})
            stage.commit_ended(transactions_open=start_new_transaction)
        if did_commit:  # how busy the worker is: the wait before the next commit depends on it
            self.last_commit_covered = sum(offset - previous for tp, offset in offsets.items()
                                           if (previous := before.get(tp)) is not None)
        if state is not None:
            state.metrics.commit_seconds.observe(time.perf_counter() - started)
        return did_commit


async def ask_start_offset(consumer: Any, tp: TP, timeout_s: float = START_OFFSET_TIMEOUT_S) -> int | None:
    """The group's committed offset of ``tp``, or with none the partition's earliest (the auto
    offset reset): where ``consumer`` (aiokafka's) began reading it. Bounded: aiokafka retries an
    offset fetch without end while the group's coordinator is away or loading."""
    partition = TopicPartition(tp.topic, tp.partition)  # aiokafka's own type, which beginning_offsets asks for
    async with asyncio.timeout(timeout_s):
        committed = await consumer.committed(partition)
        if committed is not None:
            return int(committed)
        found = await consumer.beginning_offsets([partition])
        return int(found[partition]) if partition in found else None


def consumer_of(app: AppT) -> _Consumer:
    """The worker's consumer, as the transport that app.py gives its app creates it."""
    consumer = app.consumer
    if not isinstance(consumer, _Consumer):
        raise TypeError(f"the worker's app has {type(consumer).__name__} for a consumer, not _Consumer")
    return consumer


def _coordinator(app: AppT) -> Any:
    client = getattr(getattr(consumer_of(app), "_thread", None), "_consumer", None)  # aiokafka's consumer
    return getattr(client, "_coordinator", None)


def member_id(app: AppT) -> str | None:
    """The id the group coordinator gave the worker's consumer when it last joined."""
    return getattr(_coordinator(app), "member_id", None) or None


def membership_failure(app: AppT) -> BaseException | None:
    """Why aiokafka's group coordination of the worker's consumer ended, or None while it runs. Once
    it ended the worker is no member of its group: it gets no partitions and commits nothing, and
    nothing else in aiokafka or Faust says so while no partition is assigned."""
    task = getattr(_coordinator(app), "_coordination_task", None)
    if task is None or not task.done() or task.cancelled():
        return None
    failure: BaseException | None = task.exception()
    return failure


def flow_state(app: AppT, topic: str) -> str:
    """What Faust's fetch loop holds for ``topic``'s assigned partitions, for the log of a stall:
    whether the flow is on, which partitions it pauses or fetches, the offset it last handed over
    and aiokafka's position. Each read is guarded: this runs when something is already wrong."""
    consumer = consumer_of(app)
    try:
        assigned = sorted(tp.partition for tp in consumer.assignment() if tp.topic == topic)
        paused = sorted(tp.partition for tp in consumer._paused_partitions if tp.topic == topic)
        active = sorted(tp.partition for tp in (consumer._active_partitions or ()) if tp.topic == topic)
        read = {tp.partition: offset for tp, offset in consumer._read_offset.items() if tp.topic == topic}
        client = getattr(consumer._thread, "_consumer", None)  # aiokafka's
        positions = ({tp.partition: client._subscription.subscription.assignment.state_value(tp).position
                      for tp in client.assignment() if tp.topic == topic} if client is not None else {})
        return (f"flow active {consumer.flow_active}; assigned {assigned}, paused {paused}, fetched {active}; "
                f"last handed over {read}; positions {positions}")
    except Exception as exc:  # a diagnosis must not hide the stall it reports
        return f"not read ({type(exc).__name__}: {exc})"
