"""Faust's Kafka consumer as the worker runs it: fetch waits and sizes, the fetch loop's hand-over,
the commit timer and the offsets to commit asked of the worker (seam layer over faust-streaming 0.15.3).

Paths and line numbers are of faust-streaming 0.15.3 (app/seams/__init__.py pins it;
tests/unit/test_seams_faust.py checks that each private member relied on is still there).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, AppT, Message
from mode import Service, ServiceT

from app.seams import aiokafka as kafka_seam
from app.seams.faust.app import hooks_of
from app.seams.faust.handover import HANDOVER_CHUNK, Handover
from app.waits import within

# Faust fixes the consumer's fetch wait at 1,500 ms. aiokafka keeps one fetch in flight per broker
# and leaves out the partitions whose records are still buffered or paused (Faust pauses them for
# flow control), so a fetch sent at such a moment asks only for quiet partitions and the broker
# holds it the whole wait: orderly.raw is not read meanwhile, and no batch is taken while the
# ingest appends.
FETCH_MAX_WAIT_MS = 100
DRAIN_YIELD_EVERY = 100  # the fetch loop lets other tasks run after this many records (as Faust's does)
START_OFFSET_TIMEOUT_S = 5.0  # the skip guard's question to the broker (ask_start_offset), at most
PAUSED_WAIT_S = 1.0  # with every partition paused, the fetch loop asks again after this, or at a resume


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        # faust/transport/drivers/aiokafka.py AIOKafkaConsumerThread._create_worker_consumer (line 568)
        # builds the aiokafka consumer, passing fetch_max_wait_ms=1500 with no setting to change it
        consumer = super()._create_worker_consumer(transport)
        kafka_seam.set_fetch_max_wait(consumer, FETCH_MAX_WAIT_MS)  # read when the consumer starts
        return consumer

    def client(self) -> AIOKafkaConsumer | None:
        """aiokafka's consumer, once the thread made it: AIOKafkaConsumerThread._consumer (line 547)."""
        client: AIOKafkaConsumer | None = getattr(self, "_consumer", None)
        return client


class Consumer(faust_aiokafka.Consumer):
    """Faust's consumer with the worker's fetch loop, commit timer and offsets (through its hooks,
    app/seams/faust/app.py's WorkerHooks; without them, Faust's own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # partition -> the offset the worker rewound it to (``rewind``) and the last fetch begun
        # before its seek was done (None: not done yet): the records of those fetches are dropped
        # until the record rewound to is handed over
        self._rewound: dict[TP, tuple[int, int | None]] = {}
        self._fetches = 0  # fetches the fetch loop began
        self._resumed = asyncio.Event()  # set when partitions are resumed (_wait_next_records)

    def _new_consumer_thread(self) -> ConsumerThread:
        # faust/transport/drivers/aiokafka.py Consumer._new_consumer_thread (line 237), called by
        # faust/transport/consumer.py ThreadDelegateConsumer.__init__ (line 1398) to set self._thread
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def client(self) -> AIOKafkaConsumer | None:
        """aiokafka's consumer under this one (Consumer._thread: transport/consumer.py line 1398)."""
        thread = getattr(self, "_thread", None)
        return thread.client() if isinstance(thread, ConsumerThread) else None

    def set_fetch_min_bytes(self, value: int) -> None:
        kafka_seam.set_fetch_min_bytes(self.client(), value)

    def membership(self) -> kafka_seam.Membership:
        return kafka_seam.group_membership(self.client())

    def delivers_at_once(self, tp: TP) -> bool:
        """Whether handing a record of ``tp`` to the conductor cannot wait: the flow runs, no
        subscription change holds the conductor, Faust's producer buffer is not over its limit and
        no queue of the partition's channels is full. Only then may the fetch loop await the
        hand-over itself; otherwise it must give it up when the flow stops (a rebalance clears the
        queues, and a hand-over finished after that would deliver a record of a revoked partition)."""
        app = self.app
        # faust/transport/conductor.py Conductor._tp_to_callback_lock (line 264, held while the
        # subscriptions change) and Conductor._tp_index (line 262, partition -> its channels)
        conductor: Any = app.topics
        if self.suspend_flow.is_set() or not app.flow_control.is_active() or conductor._tp_to_callback_lock.locked():
            return False
        buffer = app.producer.buffer
        if buffer.size > buffer.max_messages:
            return False
        return not any(channel.queue.full() for channel in conductor._tp_index.get(tp, ()))

    def resume_flow(self) -> None:
        super().resume_flow()
        self._resumed.set()

    async def _wait_next_records(self, timeout: float) -> tuple[Any, set[TP] | None]:  # noqa: ASYNC109  # Faust's
        """Faust's wait for the next records, without its 1 s sleep while every partition is paused.

        faust/transport/consumer.py Consumer._wait_next_records (line 776) waits for the flow to
        resume, then, with no active partition, ``await self.sleep(1)`` before its caller (getmany)
        asks again. At the end of a rebalance's recovery the flow resumes before the stream
        partitions do (faust/tables/recovery.py lines 476-479, then 649), so the fetch loop slept
        and the first records of every partition assigned waited up to 1 s after "Worker ready"
        (bench restart's ``gone``: ready → first decision about 1.0 s). Here that wait ends when the
        partitions resumed can be read: after the seek to their committed offsets that follows their
        resume (perform_seek, not at the resume itself: a fetch between the two hands over records
        the seek then hands over again), at a resume of the flow (how Faust's other resumes end), or
        after the same 1 s. A stop cancels the fetch loop's task, which ends the wait too."""
        if not self.flow_active:
            await self.wait(self.can_resume_flow.wait())  # as Faust's
        self._resumed.clear()  # before looking: a wake-up from now on ends the wait below
        if not self.app.client_only and not self._get_active_partitions():
            with contextlib.suppress(TimeoutError):
                await within(self._resumed.wait(), PAUSED_WAIT_S)
            return {}, set()  # getmany yields nothing and is called again
        records: tuple[Any, set[TP] | None] = await super()._wait_next_records(timeout)
        return records

    async def _drain_messages(self, fetcher: ServiceT) -> None:  # pragma: no cover  # Faust's thread-side loop
        """Faust's fetch loop (faust/transport/consumer.py Consumer._drain_messages, line 1170), handing
        a record over directly when that cannot wait (delivers_at_once). Faust races every hand-over
        against the flow's suspension in ``wait_first``: four tasks and an ``asyncio.wait`` per record,
        a tenth of the worker's CPU under load. Records whose hand-over could wait still go that way."""
        callback = self.callback
        read_offset = self._read_offset  # Consumer._read_offset (line 481): the last offset handed over
        acks_enabled_for = self.app.topics.acks_enabled_for
        # mode's Service._stopped (mode/services.py line 579: the Event its stop sets), as Faust's loop reads it
        consumer_stopped, fetcher_stopped = self._stopped.is_set, fetcher._stopped.is_set  # type: ignore[attr-defined]
        since_yield = 0
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                self.diag.set_flag(faust_consumer.CONSUMER_FETCHING)
                self._fetches += 1
                records = self.getmany(timeout=1.0)
                await self.sleep(0)  # getmany may return at once, again and again
                if not self.should_stop:
                    handover: Handover | None = getattr(self.app, "handover", None)
                    taken: list[Message] = []
                    reads: dict[TP, int] = {}
                    async for tp, message in records:
                        if handover is not None and tp.topic == handover.topic:
                            if self._admit(tp, message, reads):
                                taken.append(message)
                                if len(taken) >= HANDOVER_CHUNK:  # a long fetch: memory and the loop's turns
                                    await self._hand_over_fetch(handover, taken, reads)
                                    taken, reads = [], {}
                                    await asyncio.sleep(0)
                            continue
                        since_yield += 1
                        if since_yield > DRAIN_YIELD_EVERY:
                            await asyncio.sleep(0)
                            since_yield = 0
                        await self._hand_over(tp, message, read_offset.get(tp), callback, acks_enabled_for)
                    if taken:
                        await self._hand_over_fetch(handover, taken, reads)  # type: ignore[arg-type]
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
        # Faust's loop body for one record: _add_gap (line 1157), commit_if_due, _read_offset
        offset = message.offset
        if dropped(self, tp, offset, read):
            return
        if read and offset - read > 1 and acks_enabled_for(message.topic):
            await self._add_gap(tp, read + 1, offset)
        await commit_if_due(self)
        if self.delivers_at_once(tp):
            await callback(message)
        else:
            await self.wait_first(callback(message), self.suspend_flow.wait())
        if tp not in self._rewound:  # else the worker rewound it meanwhile: its offset stands
            self._read_offset[tp] = offset

    def _admit(self, tp: TP, message: Message, reads: dict[TP, int]) -> bool:
        """Whether a source record goes to the worker (handover.py): ``_hand_over``'s tests, with the
        read offsets of the records admitted before it in ``reads``; no gaps kept (_new_offset's
        offsets are the worker's, which do not read them)."""
        offset = message.offset
        if dropped(self, tp, offset, reads[tp] if tp in reads else self._read_offset.get(tp)):
            return False
        reads[tp] = offset
        return True

    async def _hand_over_fetch(self, handover: Handover, taken: list[Message], reads: dict[TP, int]) -> None:
        """Hand source records to the worker as one list, as ``_hand_over`` does one record: at once
        when that cannot wait, else raced against the flow's suspension (a rebalance: dropped)."""
        await commit_if_due(self)
        buffer = self.app.producer.buffer
        if handover.ready() and not self.suspend_flow.is_set() and buffer.size <= buffer.max_messages:
            handover.put_nowait(taken)
        else:
            await self.wait_first(handover.put(taken), self.suspend_flow.wait())
        for tp, offset in reads.items():
            if tp not in self._rewound:  # else the worker rewound it meanwhile: its offset stands
                self._read_offset[tp] = offset

    def committed_offset(self, tp: TP) -> int | None:
        """Where ``tp`` was last committed or sought to by Faust (None: not known yet);
        Consumer._committed_offset (line 482), a defaultdict."""
        return self._committed_offset.get(tp)

    def committed_offsets(self) -> dict[TP, int | None]:
        return dict(self._committed_offset)

    def should_commit(self, tp: TP, offset: int) -> bool:
        """Faust's test of an offset against the one last committed (Consumer._should_commit, line 1093)."""
        return bool(self._should_commit(tp, offset))

    async def start_offset(self, tp: TP) -> int | None:
        """Where the consumer began reading ``tp`` in this assignment, asked of the broker (on
        Faust's consumer thread, where aiokafka's consumer runs): see ``ask_start_offset``. None if
        the broker could not say within START_OFFSET_TIMEOUT_S (the caller then takes the first
        record as the start)."""
        thread = self._thread
        try:
            # mode's ServiceThread.call_thread; AIOKafkaConsumerThread._ensure_consumer (line 1065)
            start: int | None = await thread.call_thread(ask_start_offset, thread._ensure_consumer(), tp)
            return start
        except Exception as exc:  # a guard, not a step the batch depends on
            self.log.warning("could not ask where %s[%d] starts: %r", tp.topic, tp.partition, exc)
            return None

    async def rewind(self, tp: TP, offset: int) -> bool:
        """Fetch ``tp`` again from ``offset``: aiokafka's seek on Faust's consumer thread, and Faust's
        read offset put back there (as its Consumer.seek, line 587, does) so that its fetch loop
        hands the records over again. False if the consumer refused (``tp`` no longer assigned).
        Until the record at ``offset`` is handed over, the fetch loop drops the records it fetched
        before the seek and leaves the read offset alone (_hand_over): either would set it past
        the records fetched again, dropping them as read, and the worker would rewind once more."""
        thread = self._thread
        self._read_offset[tp] = offset if offset else None  # before the seek: the fetch loop runs meanwhile
        self._rewound[tp] = (offset, None)
        try:
            await thread.call_thread(seek_to, thread._ensure_consumer(), tp, offset)
        except Exception as exc:
            self._rewound.pop(tp, None)
            self.log.warning("could not fetch %s[%d] again from %d: %r", tp.topic, tp.partition, offset, exc)
            return False
        if tp in self._rewound:  # a fetch begun from here on runs after the seek on the consumer thread
            self._rewound[tp] = (offset, self._fetches)
        return True

    async def perform_seek(self) -> None:
        """Faust's seek to the committed offsets (Consumer.perform_seek, line 565: on an assignment,
        after a recovery, and at each fetch while the flow is off) supersedes the worker's rewinds.

        A stream partition its group never committed (or committed at 0) is sought to its earliest
        offset, where the consumer began it (auto_offset_reset "earliest"): aiokafka's
        seek_to_committed (consumer.py line 766) seeks only to a committed offset above 0, so such a
        partition stayed where its fetch had got to, and the records Faust fetched there and then
        dropped (getmany, line 693: its flow stopped or the generation changed mid-batch) never came
        again: a worker taking over a dead one's partition lost them until a later record arrived."""
        self._rewound.clear()
        await super().perform_seek()
        # the agents' topics only (Conductor.acks_enabled_for, line 281): not the changelogs, nor
        # the assignor's leader topic, whose reset could wait for a leader that is away
        streamed = self.app.topics.acks_enabled_for
        unstarted = [tp for tp in self.assignment() if streamed(tp.topic) and not self._committed_offset.get(tp)]
        if unstarted:
            thread = self._thread
            await thread.call_thread(seek_to_start, thread._ensure_consumer(), unstarted)
            for tp in unstarted:
                self._read_offset[tp] = None
        self._resumed.set()  # the partitions resumed before this seek are read from where it put them

    @Service.task
    async def _commit_handler(self) -> None:
        """Faust's commit timer (Consumer._commit_handler, line 910: a fixed interval), with the wait
        after each commit chosen by the worker."""
        interval = self.commit_interval
        hooks = hooks_of(self.app)
        await self.sleep(interval)
        while not self.should_stop:
            await self.commit()
            committed_at = time.monotonic()
            wait = hooks.next_commit_wait(interval) if hooks is not None else interval
            await self.sleep(interval)
            while not self.should_stop:
                now = time.monotonic()
                if hooks is None or hooks.commit_due(now - committed_at, wait):
                    break
                await self.sleep(min(interval, committed_at + wait - now))

    def _new_offset(self, tp: TP) -> int | None:
        """The offset to commit, the worker's (Consumer._new_offset, line 1097, reads it from its
        list of acks, which fell behind what was decided when records were handed over during
        recovery and again after its seek)."""
        hooks = hooks_of(self.app)
        if hooks is None:
            return super()._new_offset(tp)
        self._acked[tp].clear()  # Faust's ack lists (lines 479-480) only say which partitions have news
        self._acked_index[tp].clear()
        return hooks.decided_offset(tp)

    async def _commit_offsets(self, offsets: Any, start_new_transaction: bool = True) -> bool:
        """Consumer._commit_offsets (line 1039) as the worker's commit runs it (its hooks'
        commit_offsets, which calls ``faust_commit_offsets`` for Faust's own step)."""
        hooks = hooks_of(self.app)
        if hooks is None:
            return await self.faust_commit_offsets(offsets, start_new_transaction)
        return await hooks.commit_offsets(self, offsets, start_new_transaction)

    async def faust_commit_offsets(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        """Faust's commit of ``offsets``: its transactions (TransactionManager.commit) or its
        consumer's commit, the tables' on_commit, and its committed offsets."""
        return bool(await super()._commit_offsets(offsets, start_new_transaction))

    def flow_state(self, topic: str) -> str:
        """What Faust's fetch loop holds for ``topic``'s assigned partitions, for the log of a stall:
        whether the flow is on, which partitions it pauses or fetches, the offset it last handed over
        and aiokafka's position. Each read is guarded: this runs when something is already wrong.
        Consumer._paused_partitions and _active_partitions: transport/consumer.py
        Consumer._reset_state, lines 518-519."""
        try:
            assigned = sorted(tp.partition for tp in self.assignment() if tp.topic == topic)
            paused = sorted(tp.partition for tp in self._paused_partitions if tp.topic == topic)
            active = sorted(tp.partition for tp in (self._active_partitions or ()) if tp.topic == topic)
            read = {tp.partition: offset for tp, offset in self._read_offset.items() if tp.topic == topic}
            client = self.client()
            positions = kafka_seam.positions(client, topic) if client is not None else {}
            return (f"flow active {self.flow_active}; assigned {assigned}, paused {paused}, fetched {active}; "
                    f"last handed over {read}; positions {positions}")
        except Exception as exc:  # a diagnosis must not hide the stall it reports
            return f"not read ({type(exc).__name__}: {exc})"


def dropped(consumer: Any, tp: TP, offset: int, read: int | None) -> bool:
    """Whether the fetch loop (_hand_over, _admit) drops a record, ``read`` the offset last handed over:
    handed over before (as Faust drops it), or fetched before the worker's rewind (it comes again from
    the seek, in order) unless Faust sought elsewhere since or it is the record rewound to. Past the
    rewind the loop goes on as ever (a broker's reset lands past it: the worker's guard tells)."""
    rewound = consumer._rewound.get(tp)
    if rewound is not None:
        to, last_before = rewound
        if read == (to or None) and offset != to and (last_before is None or consumer._fetches <= last_before):
            return True
        del consumer._rewound[tp]
    return read is not None and offset < read


async def commit_if_due(consumer: Any) -> None:
    """Faust's commit every broker_commit_every acks (Consumer._commit_every, line 471; _n_acked, line 440)."""
    if consumer._commit_every is not None and consumer._n_acked >= consumer._commit_every:
        consumer._n_acked = 0
        await consumer.commit()


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


async def seek_to(consumer: Any, tp: TP, offset: int) -> None:
    """aiokafka's seek (on the thread its consumer runs on): the next fetch of ``tp`` starts at ``offset``."""
    consumer.seek(TopicPartition(tp.topic, tp.partition), offset)


async def seek_to_start(consumer: Any, tps: list[TP], timeout_s: float = START_OFFSET_TIMEOUT_S) -> None:
    """aiokafka's seek_to_beginning (on the thread its consumer runs on): the partitions' offsets are
    reset to the earliest before their next fetch. Waited for at most ``timeout_s``: the wait is for
    the broker's answer, which a partition without a leader delays, and the thread's other calls
    (the fetches) wait behind it; the reset itself goes on in aiokafka's fetcher."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await consumer.seek_to_beginning(*(TopicPartition(tp.topic, tp.partition) for tp in tps))


def consumer_of(app: AppT) -> Consumer:
    """The worker's consumer, as the seam's Transport creates it."""
    consumer = app.consumer
    if not isinstance(consumer, Consumer):
        raise TypeError(f"the worker's app has {type(consumer).__name__} for a consumer, not the seam's Consumer")
    return consumer
