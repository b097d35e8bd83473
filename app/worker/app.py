"""`orderly worker`: the Faust stream processor around the pure core (thin I/O shell).

One agent consumes ``orderly.raw`` (webhooks, synced fetches and the merchant's correlations, each
under its resource's key, so the instance that owns a partition sees every record about its
resources in the log's one order, live and in replay) and keeps each resource's state in a
changelogged Faust table.

The order inside a batch. With at-least-once, each batch first sends its outputs and waits for
Kafka to acknowledge them, and only then writes the table. Any commit therefore covers state whose
outputs are already durable; a crash before the commit replays the batch, which re-emits the same
records with the same keys, and every sink dedupes on them. With ``processing_guarantee=
exactly_once`` a batch's outputs and changelog are staged and go into its source partition's Kafka
transaction, with the consumed offsets, when Faust commits it (TransactionStage): Faust itself would
commit only the changelog and the offsets, and send an agent's other records outside the
transaction (tests/integration/test_faust_recovery.py shows a re-publish after kill -9).

The table is written the way Faust writes it (changelog record, then the local store, then the
store's changelog offset), but a batch at a time: one aiokafka batch per changelog partition instead
of Faust's per-key send, callback and offset write, which cost a quarter of the worker's CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import types
import weakref
from collections.abc import Awaitable, Iterable, Iterator
from typing import Any

import faust
from aiohttp import web
from aiokafka import TopicPartition
from faust.streams import _current_event
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from mode import Service
from rocksdict import WriteBatch

from app.core.dispatch import STAGE, Incoming, Record, plan_batch
from app.core.pacing import BUSY_BATCH, busy_pause
from app.liveness import Liveness
from app.metrics import WorkerMetrics
from app.producer import KeyedProducer, send_keyed
from app.settings import Settings
from topics.admin import topic_configs
from topics.catalog import DERIVED_RECORD_BYTES, REQUEST_BYTES, names

log = logging.getLogger("orderly.worker")
BATCH_MAX = int(os.environ.get("ORDERLY_WORKER_BATCH", "1000"))
STALLED_EXIT_CODE, FAILED_EXIT_CODE, SKIPPED_EXIT_CODE = 3, 4, 5
BATCH_WITHIN_S = 0.02  # a batch waits at most this for more records: part of the latency at low load
# Under load, batches are let grow (app/core/pacing.py): after a batch of BUSY_BATCH records or more,
# the next one is taken no sooner than BUSY_INTERVAL_S after it, unless a full batch is already
# waiting (a backlog).
# Each batch costs a produce request per output topic-partition (and, until the exactly-once
# changelog went at commit, one per transactional producer: at 200 records a batch instead of
# 1,000 exactly-once decided 15 % fewer records/s, bench/worker.py with ORDERLY_WORKER_BATCH=200).
# End to end at 3,000-3,800 webhooks/s this halves the batches (20-25 instead of 45-55 for 9,000
# webhooks): a median 3 % faster over 10 side-by-side pairs (-4 to +11 %). At 500 webhooks/s
# batches stay small: p99 unchanged.
BUSY_INTERVAL_S = int(os.environ.get("ORDERLY_WORKER_BUSY_INTERVAL_MS", "100")) / 1000


# One RocksDB per owned partition. Faust's defaults (3 x 64 MiB memtables and a 2 GiB block cache,
# per partition) would let 12 partitions grow past 20 GiB; these keep a worker well under 1 GiB
# with a million resources (bench/state.py), the rest of the state staying on disk.
ROCKSDB_OPTIONS = {"driver": "rocksdict", "write_buffer_size": 4 << 20, "max_write_buffer_number": 2,
                   "block_cache_size": 16 << 20}

# Faust fixes the consumer's fetch wait at 1,500 ms. aiokafka keeps one fetch in flight per broker
# and leaves out the partitions whose records are still buffered or paused (Faust pauses them for
# flow control), so a fetch sent at such a moment asks only for quiet partitions and the broker
# holds it the whole wait: orderly.raw is not read meanwhile (seen: no batch for 1.4 s while the
# ingest appended 7,000 records/s; the end-to-end rate rose by a fifth without it).
FETCH_MAX_WAIT_MS = 100
# Under load the fetches grow as well: after a busy batch the worker's fetches ask the broker for at
# least this much (or FETCH_MAX_WAIT_MS), after a small one for any record at all. Asking for any
# record while the ingest appends thousands a second returns a fetch per few records, each costing
# the worker's consumer thread and the broker a request for 24 partitions.
BUSY_FETCH_MIN_BYTES = 256 * 1024


# Commits adapt to load the same way: after a commit that covered BUSY_COMMIT_RECORDS records or
# more, the next one comes after the busy commit interval (ORDERLY_BUSY_COMMIT_INTERVAL_S) instead
# of the commit interval, or as soon as the worker has been idle for QUIET_S (no batch taken or
# finished: the flow stopped, and its tail is not held back). With exactly-once every commit is a
# transaction per partition with new records, and the projector sees a decision only once its
# transaction commits: at 500 webhooks/s a commit covers a few dozen records and comes every
# 0.05 s, for latency; at 3,000 and more it covers hundreds, and a commit every 0.3 s spares the
# broker most of the transactions.
BUSY_COMMIT_RECORDS = 250
QUIET_S = BUSY_INTERVAL_S + 0.05  # longer than a busy worker's pause between batches


def next_commit_wait(covered: int, interval: float, busy_interval: float) -> float:
    """Seconds from the end of a commit that covered ``covered`` records to the next commit."""
    return busy_interval if covered >= BUSY_COMMIT_RECORDS else interval


def commit_due(since_commit: float, wait: float, since_batch: float) -> bool:
    """Whether to commit now, ``since_commit`` seconds after the last commit with ``wait`` chosen
    for the next, and ``since_batch`` seconds after a batch was last taken or finished."""
    return since_commit >= wait or since_batch >= QUIET_S


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

    @Service.task
    async def _commit_handler(self) -> None:
        """Faust's commit timer (a fixed interval), with the wait chosen after each commit."""
        interval = self.commit_interval
        busy_interval: float = getattr(self.app, "busy_commit_interval", interval)
        metrics: WorkerMetrics | None = getattr(self.app, "orderly_metrics", None)
        await self.sleep(interval)
        while not self.should_stop:
            await self.commit()
            committed_at = time.monotonic()
            covered, self.last_commit_covered = self.last_commit_covered, 0
            wait = next_commit_wait(covered, interval, busy_interval)
            if metrics is not None:
                metrics.commit_wait.set(wait)
            await self.sleep(interval)
            while not self.should_stop:
                now = time.monotonic()
                if commit_due(now - committed_at, wait, now - getattr(self.app, "last_batch_at", 0.0)):
                    break
                await self.sleep(min(interval, committed_at + wait - now))

    def _new_offset(self, tp: TP) -> int | None:
        """The offset to commit: the one after the last record the worker decided (at-least-once:
        its outputs acknowledged and the table written; exactly-once: staged for the partition's
        transaction). Faust's own answer, from its list of acks, fell behind what was decided when
        records were handed over during recovery and again after its seek (seen: acks 208, 209,
        209, 210, ... against 207 committed, so 209 committed while 501 was decided and staged):
        a commit then carried the outputs of records it did not cover."""
        positions: dict[Any, int] | None = getattr(self.app, "decided_positions", None)
        if positions is None:
            return super()._new_offset(tp)
        self._acked[tp].clear()  # Faust's ack lists only say which partitions have news
        self._acked_index[tp].clear()
        return positions.get(tp)

    async def _commit_offsets(self, offsets: Any, start_new_transaction: bool = True) -> bool:
        """With exactly-once, the batches' staged outputs and changelog go into the partitions' open
        transactions first, and each committed partition's values reach the local store once they
        commit. The offsets are taken again in the same step as the staged writes: a batch decided
        since Faust chose them is in both or in neither."""
        started = time.perf_counter()
        stage: TransactionStage | None = getattr(self.app, "transaction_stage", None)
        before = dict(self._committed_offset)
        if stage is None or not self.in_transaction:
            did_commit = bool(await super()._commit_offsets(offsets, start_new_transaction))
        else:
            positions: dict[Any, int] = getattr(self.app, "decided_positions", {})
            offsets = {tp: offset for tp, offset in positions.items() if self._should_commit(tp, offset)}
            await stage.flush()  # takes the staged writes before it first waits
            did_commit = bool(offsets) and bool(await super()._commit_offsets(offsets, start_new_transaction))
            if did_commit:
                assigned = self.assignment()
                stage.committed({tp.partition for tp in offsets if tp in assigned})
        if did_commit:  # how busy the worker is: the wait before the next commit depends on it
            self.last_commit_covered = sum(offset - previous for tp, offset in offsets.items()
                                           if (previous := before.get(tp)) is not None)
        metrics: WorkerMetrics | None = getattr(self.app, "orderly_metrics", None)
        if metrics is not None:
            metrics.commit_seconds.observe(time.perf_counter() - started)
        return did_commit


class _Producer(faust_aiokafka.Producer):
    async def commit_transactions(self, tid_to_offset_map: Any, group_id: str,
                                  start_new_transaction: bool = True) -> None:
        """Faust commits each partition's transaction after the previous one has finished, each a
        few round trips to the broker; they are independent (a producer each), so they go at once."""
        async def commit(transactional_id: str, offsets: Any) -> None:
            async with self._trn_locks[transactional_id]:
                transactional = self._transaction_producers.get(transactional_id)
                if transactional is None:
                    log.warning("commit asked for unknown transaction %s", transactional_id)
                    return
                await transactional.send_offsets_to_transaction(offsets, group_id)
                await transactional.commit_transaction()
                if start_new_transaction:
                    await transactional.begin_transaction()
        await asyncio.gather(*(commit(tid, offsets) for tid, offsets in tid_to_offset_map.items()))


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer
    Producer = _Producer


class PartitionStore:
    """The table's local store, read and written a partition at a time. With RocksDB a batch's new
    values and the changelog offset they reach go into the partition's database as one WriteBatch:
    one write instead of a write per key (Faust's per-key path was a tenth of the worker's CPU end
    to end), and the offset can never get ahead of the values. Another store (memory) is written
    through Faust's table API as if inside an event of the partition."""

    def __init__(self, store: Any, changelog: str) -> None:
        self.store = store
        self.changelog = changelog
        self.rocksdb = bool(getattr(store, "use_rocksdict", False))  # Faust's RocksDB store, rocksdict driver

    def get(self, partition: int, key: bytes) -> bytes | None:
        if self.rocksdb:
            value: bytes | None = self.store._db_for_partition(partition).get(key)
            return value
        with inside(PartitionEvent(partition)):
            return self.store.get(key)  # type: ignore[no-any-return]

    def write(self, partition: int, values: Iterable[tuple[bytes, bytes]], offset: int | None) -> None:
        """Write ``values`` and (if not None) the changelog offset they reach, for ``partition``."""
        if self.rocksdb:
            batch = WriteBatch(raw_mode=True)
            for key, value in values:
                batch.put(key, value)
            if offset is not None:
                batch.put(self.store.offset_key, str(offset).encode())
            self.store._db_for_partition(partition).write(batch)
            return
        with inside(PartitionEvent(partition)):
            for key, value in values:
                self.store[key] = value
        if offset is not None:
            self.store.set_persisted_offset(TP(self.changelog, partition), offset)


class TransactionStage:
    """Exactly-once: what a batch writes, its outputs (decisions, effects, facts, state snapshots)
    and its table values, goes into its source partition's Kafka transaction when Faust commits
    that with the consumed offsets; the local store gets the values only once it has committed. So
    a crash or a revocation before the commit loses all of it together: read_committed readers
    (projector, effects worker, fetcher, replay) never see outputs whose offsets were not
    committed, and the records are decided again from committed state, with their full outputs.
    (A local store ahead of the committed changelog would recognise them as decided and re-emit
    only a summary: seen here as reversals whose read-model row and debit were lost.)

    Sent at commit, a record per resource changed since the last commit for the changelog,
    instead of a produce request per partition's transactional producer in every batch (with
    200-record batches exactly-once decided 15 % fewer records/s than at-least-once, and the broker
    spent 40 % more CPU). ``get`` reads the values not yet committed, which the worker consults
    before the table. The worker's consumer calls ``flush`` before Faust commits the transactions
    and ``committed`` after: every offset a commit covers was acked after its writes were staged,
    so they are in the transaction that commits the offset. ``committed`` also writes the store's
    changelog offset, which Faust's own exactly-once path never persists (it keeps it under the
    changelog partition and looks it up under the source partitions), so a restart reads on from
    local state."""

    def __init__(self, topic: str, producer_for: Any, store: PartitionStore, outputs: KeyedProducer) -> None:
        self.topic = topic
        self.producer_for = producer_for  # partition -> (transactional producer, lock) or None
        self.store = store
        self.outputs = outputs  # partitions the output records like every other Orderly producer
        self.pending: dict[int, dict[bytes, bytes]] = {}  # table values not sent yet
        self.pending_outputs: dict[int, list[Record]] = {}
        self.in_flight: dict[int, dict[bytes, bytes]] = {}  # table values sent in the open transaction
        self.sent: dict[int, int] = {}  # partition -> last changelog offset sent in its open transaction

    def stage(self, partition: int, key: bytes, value: bytes) -> None:
        self.pending.setdefault(partition, {})[key] = value

    def stage_outputs(self, partition: int, records: list[Record]) -> None:
        self.pending_outputs.setdefault(partition, []).extend(records)

    def get(self, partition: int, key: bytes) -> bytes | None:
        """The key's value not yet committed, if it has one."""
        for values in (self.pending.get(partition), self.in_flight.get(partition)):
            if values is not None and (value := values.get(key)) is not None:
                return value
        return None

    async def flush(self) -> None:
        staged, self.pending = self.pending, {}
        outputs, self.pending_outputs = self.pending_outputs, {}
        for partition, changed in staged.items():
            self.in_flight.setdefault(partition, {}).update(changed)
        sent, acks = [], []
        for partition in staged.keys() | outputs.keys():
            target = self.producer_for(partition)
            if target is None:  # no transaction for it any more (revoked): its offsets are not committed here
                continue
            kafka, lock = target
            if partition in outputs:
                async with lock:
                    acks.append(await self.outputs.enqueue_all(outputs[partition], via=kafka, partition=partition))
            if partition in staged:
                items = staged[partition].items()
                sent.append((partition, await send_keyed(kafka, lock, (self.topic, partition), items)))
        for acknowledged in acks:
            await acknowledged
        for partition, last in sent:
            self.sent[partition] = max(self.sent.get(partition, -1), await last)

    def committed(self, partitions: set[int]) -> None:
        for partition in partitions:
            last = self.sent.pop(partition, None)
            self.store.write(partition, self.in_flight.pop(partition, {}).items(), last)

    def revoked(self, partitions: set[int]) -> None:
        """A revoked partition's staged writes and uncommitted offset are dropped: Faust stops its
        transactional producer without committing, and its offsets are the next owner's to decide again."""
        for partition in partitions:
            for staged in (self.pending, self.pending_outputs, self.in_flight, self.sent):
                staged.pop(partition, None)


class PartitionEvent:
    """Stands for an event of ``partition`` where Faust's store asks the current event which
    partition's database to use."""

    def __init__(self, partition: int) -> None:
        self.message = types.SimpleNamespace(partition=partition)


class OffsetGuard:
    """Notices records Faust never handed to the agent, and records it hands over again.

    Skipped records, seen after restarts: 50 of 98 records of a partition skipped with
    exactly-once (whose recovery waits 10 s while the fetcher runs), so the state missed updates
    whose decisions were out; also with at-least-once, less often. Faust's code suggests how: its
    fetch loop sets a partition's read offset after each record it hands over, so a seek to the
    committed offsets (at the end of every recovery) that lands meanwhile is undone, and the
    records in between are dropped as already read. orderly.raw is never
    compacted nor written in transactions, so their offsets have no holes: a record beyond the
    offset after the highest handed over so far (the committed one, before the first) means
    records were skipped.

    Records handed over again (after such a seek) were decided already in this assignment, and
    their outputs are durable (at-least-once) or in the partition's open transaction
    (exactly-once), or they are below the committed offset: they are acked, not decided again
    (exactly-once would otherwise commit their decisions twice, seen here: 1,009 of 3,138)."""

    def __init__(self) -> None:
        self.high: dict[Any, int] = {}  # partition -> one past the highest offset handed over

    def forget(self, tps: Any) -> None:
        for tp in tps:
            self.high.pop(tp, None)

    def check(self, tp: Any, offset: int, committed: int | None) -> tuple[bool, int | None]:
        """Whether ``offset`` of ``tp`` was handed over before (or is below ``committed``), and the
        first offset skipped before it, or None; ``committed`` is where the partition's first
        record is expected (None: unknown)."""
        high = self.high.get(tp, committed)
        self.high[tp] = offset + 1 if high is None else max(high, offset + 1)
        if high is None:
            return False, None
        return offset < high, (high if offset > high else None)


def exit_for_restart(code: int, message: str, *args: Any, exc_info: bool = False) -> None:
    """Log why and end the process at once, nothing acked: its supervisor starts it again, and it
    resumes from the committed offsets with the state recovered from Kafka."""
    log.critical(message, *args, exc_info=exc_info)
    logging.shutdown()
    os._exit(code)


TABLE = "resources"


def changelog_topic(namespace: str) -> str:
    """The Faust changelog of the worker's table (Faust names it ``{app id}-{table}-changelog``)."""
    return names(namespace).changelog


async def record_limit(settings: Settings) -> int:
    """The largest record every topic the worker writes accepts (an installation's topics may have
    been created with a smaller max.message.bytes than today's catalog)."""
    n = names(settings.namespace)
    written = [n.state, n.decisions, n.facts, n.effects, n.changelog]  # quarantine: raw bodies, as raw takes them
    configs = await topic_configs(settings.kafka_bootstrap, written)
    return min(int(configs.get(topic, {}).get("max.message.bytes") or DERIVED_RECORD_BYTES) for topic in written)


@contextlib.contextmanager
def inside(event: Any) -> Iterator[None]:
    """Read or write the table as if inside ``event``'s iteration: Faust's RocksDB store uses the
    current event's partition (without one, a read of a new key looks in every partition's
    database). Only this task's context variable is touched: changing the stream's own current
    event instead would make take_events() buffer the wrong event for a record that arrives
    meanwhile (seen here as one record processed twice and the next one lost)."""
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)


def dump_tasks() -> None:
    """kill -USR1 <worker pid>: log where every asyncio task is waiting (for a worker that looks stuck)."""
    for task in asyncio.all_tasks():
        frames: list[str] = []
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            if frame is not None:
                frames.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
        log.warning("task %s:\n%s", task.get_name(), "\n".join(frames))


def build_app(settings: Settings, max_record_bytes: int = DERIVED_RECORD_BYTES) -> faust.App:
    n = names(settings.namespace)
    datadir = settings.data_dir / f"{settings.namespace}-worker"
    datadir.mkdir(parents=True, exist_ok=True)  # Faust creates only the last level
    app = faust.App(
        f"{settings.namespace}-worker",
        broker=f"kafka://{settings.kafka_bootstrap}",
        store="rocksdb://" if settings.store == "rocksdb" else "memory://",
        processing_guarantee=settings.processing_guarantee,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        datadir=str(datadir),
        web_enabled=bool(settings.metrics_port),
        web_bind="127.0.0.1" if settings.ingest_host == "127.0.0.1" else "0.0.0.0",
        web_port=settings.metrics_port or 6066,
        broker_session_timeout=10,
        broker_heartbeat_interval=1,
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",  # values are JSON bytes made by orjson, not Faust's codecs
        # A changelog write per resource per batch goes to one of up to `partitions` transactional
        # producers; lingering lets each send a batch instead of a request per record.
        producer_linger=0.005,
        broker_commit_interval=settings.worker_commit_interval_s,
        producer_max_batch_size=256 * 1024,
        # every record a worker writes or reads fits (DESIGN.md §2.4): a changelog value holds a
        # resource's state with its parked events, up to app/core/dispatch.py's limit
        producer_max_request_size=REQUEST_BYTES,
        consumer_max_fetch_size=REQUEST_BYTES,
    )
    app.transport = _Transport(app.conf.broker_consumer, app)
    app.busy_commit_interval = settings.worker_busy_commit_interval_s  # type: ignore[attr-defined]  # read by _Consumer
    source = app.topic(n.raw, key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")
    table = app.Table(TABLE, partitions=settings.partitions, key_type=bytes, value_type=bytes,
                      extra_topic_configs={"max.message.bytes": str(DERIVED_RECORD_BYTES)},
                      options=ROCKSDB_OPTIONS if settings.store == "rocksdb" else None)
    metrics = WorkerMetrics()
    app.orderly_metrics = metrics  # type: ignore[attr-defined]  # read by _Consumer
    changelog = changelog_topic(settings.namespace)
    producer = KeyedProducer(settings.kafka_bootstrap, linger_ms=0)  # send_all hands over whole batches
    liveness = Liveness(settings.kafka_bootstrap, f"{settings.namespace}-worker", settings.worker_stall_s)

    @app.task  # type: ignore[untyped-decorator]
    async def on_start() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)

    @app.agent(source)
    async def process(stream: faust.StreamT[bytes]) -> None:
        await producer.start()  # here, not in a task: the agent may receive records before tasks run
        # Events are acked by hand, only once their outputs are acknowledged and the table written:
        # take_events() would ack a batch whose processing raised or was cancelled half-way.
        async for events in stream.noack_take(BATCH_MAX, within=BATCH_WITHIN_S):  # type: ignore[attr-defined]
            taken = app.last_batch_at = time.monotonic()  # type: ignore[attr-defined]  # read by _Consumer
            fresh = await not_handed_before(events)
            try:
                if fresh:
                    await decide_batch(fresh)
            except Exception:  # a bug, not bad input (bad input is quarantined by the reducers)
                exit_for_restart(FAILED_EXIT_CODE, "the worker failed on a batch; exiting without acking it",
                                 exc_info=True)  # the batch is decided again
            for event in events:
                await stream.ack(event)
            waiting = stream.channel.queue.qsize()  # type: ignore[attr-defined]  # records Faust has fetched for us
            app.consumer._thread.set_fetch_min_bytes(fetch_min_bytes(len(events)))  # type: ignore[attr-defined]
            app.last_batch_at = time.monotonic()  # type: ignore[attr-defined]  # a long batch is not a quiet time
            pause = busy_pause(len(events), waiting, taken, app.last_batch_at,  # type: ignore[attr-defined]
                               BUSY_INTERVAL_S, BATCH_MAX)
            if pause:
                await asyncio.sleep(pause)  # under load: let the next batch grow

    guard = OffsetGuard()
    positions: dict[Any, int] = {}  # partition -> the offset after the last record decided (committable)
    app.decided_positions = positions  # type: ignore[attr-defined]  # read by _Consumer

    async def not_handed_before(events: list[Any]) -> list[Any]:
        """The events to decide: those not handed over before. Exits if records were skipped."""
        committed = app.consumer._committed_offset  # type: ignore[attr-defined]  # set by Faust's seek and commits
        fresh = []
        for event in events:
            tp, offset = event.message.tp, event.message.offset
            again, first_skipped = guard.check(tp, offset, committed.get(tp))
            if not again:
                fresh.append(event)
            if first_skipped is None:
                continue
            earliest = (await app.consumer.earliest_offsets(tp)).get(tp)
            if earliest is not None and earliest >= offset:  # deleted by retention, not skipped
                continue
            exit_for_restart(SKIPPED_EXIT_CODE, "records %s[%d] %d-%d were never handed to the worker (Faust "
                             "skipped them); exiting without acking, so that the supervisor restarts it from "
                             "the committed offsets", tp.topic, tp.partition, first_skipped, offset - 1)
        if len(fresh) < len(events):
            metrics.handed_again.inc(len(events) - len(fresh))
        return fresh

    async def decide_batch(events: list[Any]) -> None:
        started = time.perf_counter()

        def read(partition: int, key: bytes) -> bytes | None:
            stored = stage.get(partition, key)  # exactly-once: not committed yet
            return stored if stored is not None else local.get(partition, key)

        plan = plan_batch(n, [Incoming(e.key, e.value, e.message.headers or [], e.message.offset,
                                       e.message.partition, e.message.topic) for e in events], read,
                          max_record_bytes)
        for decision in plan.errors:
            metrics.errors.labels(decision.gateway).inc()
            log.error("%s %s: %s", decision.gateway, decision.resource_id, decision.error)
        for gateway, reason in plan.set_aside:
            metrics.set_aside.labels(STAGE, gateway).inc()
            log.error("a record was set aside to quarantine (%s): %s", gateway, reason)
        if app.in_transaction:  # they go into the partition's transaction when it commits
            for partition, outputs in plan.records.items():
                stage.stage_outputs(partition, outputs)
        else:  # durable before the state that implies them
            await (await producer.enqueue_partitioned(plan.records))
        for (gateway, outcome), count in plan.outcomes.items():
            metrics.decisions.labels(gateway, outcome).inc(count)
        for (gateway, kind), count in plan.effects.items():
            metrics.effects.labels(gateway, kind).inc(count)
        await write_state(plan.states, {key: events[index] for key, index in plan.last.items()})
        # what the next commit may cover; exactly-once: in the same step as the staging above, so
        # that a commit takes a batch's writes and its offsets together or neither
        decided = {TopicPartition(e.message.topic, e.message.partition): e.message.offset for e in events}
        for tp, offset in decided.items():
            positions[tp] = max(positions.get(tp, 0), offset + 1)
        metrics.batch_seconds.observe(time.perf_counter() - started)
        metrics.batch_size.observe(len(events))
        liveness.on_batch(decided)

    def changelog_producer(partition: int) -> tuple[Any, Any] | None:
        """The producer (and its lock) that writes a changelog partition, as Faust picks it: with
        exactly-once, the transactional producer of the partition's task, which commits the
        changelog with the consumed offsets; None if this worker holds no transaction for it."""
        if not app.in_transaction:
            return producer.producer, contextlib.nullcontext()
        tid = f"{app.conf.id}-{app.assignor.group_for_topic(changelog)}-{partition}"
        transactional = app.producer._transaction_producers.get(tid)  # type: ignore[attr-defined]
        return (transactional, app.producer._trn_locks[tid]) if transactional is not None else None  # type: ignore[attr-defined]

    local = PartitionStore(table.data, changelog)
    stage = TransactionStage(changelog, changelog_producer, local, producer)
    if settings.processing_guarantee == "exactly_once":
        app.transaction_stage = stage  # type: ignore[attr-defined]  # read by _Consumer

    async def write_state(states: dict[bytes, bytes], last_event: dict[bytes, Any]) -> None:
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
            target = changelog_producer(partition)
            if target is None:  # mid-rebalance: Faust's own path, which knows what to do
                faust_path = True
                for key in keys:
                    with inside(last_event[key]):
                        table[key] = states[key]
            elif app.in_transaction:  # staged: into the partition's transaction, and the store once it commits
                for key in keys:
                    stage.stage(partition, key, states[key])
            else:
                kafka, lock = target
                sent.append((partition, await send_keyed(kafka, lock, (changelog, partition),
                                                         ((key, states[key]) for key in keys))))
        for partition, acknowledged in sent:
            last = await acknowledged  # the store itself: its changelog records are in Kafka
            local.write(partition, ((key, states[key]) for key in by_partition[partition]), last)
        if faust_path:
            await app.producer.flush()

    @app.timer(interval=5.0)  # type: ignore[untyped-decorator]
    async def watchdog() -> None:
        if app.in_recovery or getattr(app, "rebalancing", False):  # restoring a large table takes as long as it takes
            liveness.last_progress = time.monotonic()
            return
        behind = await liveness.stalled()
        if behind:
            waiting = ", ".join(f"{tp.topic}[{tp.partition}]: {count}" for tp, count in sorted(behind.items()))
            exit_for_restart(STALLED_EXIT_CODE, "no batch decided for %.0f s while records wait (%s): exiting so "
                             "that the supervisor restarts this worker (state and offsets are recovered from "
                             "Kafka)", liveness.quiet_for(), waiting)

    if settings.metrics_port:
        @app.page("/metrics")
        async def metrics_page(web_view: Any, request: Any) -> Any:
            body, content_type = metrics.render()
            return web_view.bytes(body, content_type=content_type.split(";")[0])

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def log_assignment(app: faust.App, assigned: set[Any], **kwargs: Any) -> None:
        mine = sorted(tp.partition for tp in assigned if tp.topic == n.raw)
        liveness.on_assigned({TopicPartition(tp.topic, tp.partition) for tp in assigned
                              if tp.topic == n.raw})
        guard.forget(assigned)  # a new assignment starts at the committed offsets
        for tp in assigned:
            positions.pop(tp, None)
        metrics.partitions.set(len(mine))
        log.info("Assigned partitions: %d of %s: %s", len(mine), n.raw, mine)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def drop_revoked(app: faust.App, revoked: set[Any], **kwargs: Any) -> None:
        stage.revoked({tp.partition for tp in revoked if tp.topic == n.raw})

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def stop_producer(app: faust.App, **kwargs: Any) -> None:
        await producer.stop()
        await liveness.close()

    return app


class QuietWorker(faust.Worker):
    """Faust's worker sets the root logger to DEBUG so that every log record turns its terminal
    spinner; then every debug call in Faust and mode builds a LogRecord (5% of the worker's CPU,
    measured with py-spy). No spinner: the root logger keeps the configured level."""

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        self.spinner = None
        logger.setLevel(level or logging.WARNING)


def run(settings: Settings) -> None:
    limit = asyncio.run(record_limit(settings))
    if limit < DERIVED_RECORD_BYTES:
        log.warning("a topic the worker writes takes records of at most %d bytes (the catalog sets %d): records "
                    "whose outputs pass half of that are set aside; raise max.message.bytes to lift it",
                    limit, DERIVED_RECORD_BYTES)
    app = build_app(settings, max_record_bytes=limit)
    worker = QuietWorker(app, loglevel=os.environ.get("ORDERLY_FAUST_LOGLEVEL", "warn"), quiet=True)
    worker.execute_from_commandline()


__all__ = ["build_app", "run", "web"]
