"""Exactly-once: a batch's writes staged for its partition's Kafka transaction, committed concurrently (I/O shell)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import ProducerFenced
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, AppT

from app.core.dispatch import Record
from app.producer import KeyedProducer, send_keyed
from app.settings import TRANSACTION_TIMEOUT_S
from app.worker import fencing
from app.worker.exits import FAILED_EXIT_CODE, exit_for_restart
from app.worker.store import PartitionStore

log = logging.getLogger("orderly.worker")

# The producer that writes a partition's records, and the lock its sends take.
Target = tuple[AIOKafkaProducer, AbstractAsyncContextManager[Any]]


class WriteFailed(Exception):
    """A write into ``partition``'s open transaction failed (the cause says how), in its ``generation``."""

    def __init__(self, partition: int, generation: int) -> None:
        super().__init__(f"a write into the open transaction of partition {partition} failed")
        self.partition = partition
        self.generation = generation


class TransactionStage:
    """Exactly-once: what a batch writes, its outputs (decisions, effects, facts, state snapshots)
    and its table values, goes into its source partition's Kafka transaction, which Faust commits
    with the consumed offsets; the local store gets the values only once it has committed. So
    a crash or a revocation before the commit loses all of it together: read_committed readers
    (projector, effects worker, fetcher, replay) never see outputs whose offsets were not
    committed, and the records are decided again from committed state, with their full outputs.
    (A local store ahead of the committed changelog would recognise them as decided and re-emit
    only a summary: seen here as reversals whose read-model row and debit were lost.)

    A batch's writes are sent into the open transactions as the batch ends (``send``), each send
    after the one before it (a key's changelog values stay in order), while no commit is under
    way; the batches decided during a commit are held until it ends. The worker's consumer calls
    ``flush`` in the same step as it takes the offsets to commit: it sends what is held, waits
    until Kafka acknowledged every write of the batches those offsets cover, and from then on
    holds new batches' writes until ``commit_ended``: a transaction never carries the writes of a
    batch whose offsets it does not commit. (Sent all at the commit instead, thousands of records
    serialised at once held up the next batches, and every decision waited for that too.)

    ``get`` reads the values not yet committed, which the worker consults before the table.
    ``committed`` also writes the store's changelog offset, which Faust's own exactly-once path
    never persists (it keeps it under the changelog partition and looks it up under the source
    partitions), so a restart reads on from local state."""

    def __init__(self, topic: str, producer_for: Callable[[int], Target | None], store: PartitionStore,
                 outputs: KeyedProducer) -> None:
        self.topic = topic
        self.producer_for = producer_for  # None: this worker holds no transaction for the partition
        self.store = store
        self.outputs = outputs  # partitions the output records like every other Orderly producer
        self.pending: dict[int, dict[bytes, bytes]] = {}  # table values not sent yet
        self.pending_outputs: dict[int, list[Record]] = {}
        self.in_flight: dict[int, dict[bytes, bytes]] = {}  # table values sent in the open transaction
        self.sent: dict[int, int] = {}  # partition -> last changelog offset sent in its open transaction
        self.holding = False  # a commit is under way (or the transactions ended): writes wait
        self.sends: list[asyncio.Task[None]] = []  # since the last flush, each awaiting the one before
        self.unacked: dict[int, list[Awaitable[Any]]] = {}  # per partition: outputs' acks, changelog's last offsets
        self.generation: dict[int, int] = {}  # per partition, the revocations seen
        self.written: set[int] = set()  # partitions written to since their last commit
        self.dirty: set[int] = set()  # revoked with writes in their open transaction: it must be aborted

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

    def send(self) -> None:
        """Send the staged writes into the open transactions, unless a commit holds them."""
        if self.holding or not (self.pending or self.pending_outputs):
            return
        staged, self.pending = self.pending, {}
        outputs, self.pending_outputs = self.pending_outputs, {}
        for partition, changed in staged.items():
            self.in_flight.setdefault(partition, {}).update(changed)
        partitions = {partition: self.generation.get(partition, 0) for partition in staged.keys() | outputs.keys()}
        before = self.sends[-1] if self.sends else None
        self.sends.append(asyncio.ensure_future(self._send(before, partitions, staged, outputs)))

    async def _send(self, before: asyncio.Task[None] | None, partitions: dict[int, int],
                    staged: dict[int, dict[bytes, bytes]], outputs: dict[int, list[Record]]) -> None:
        if before is not None:
            await asyncio.wait([before])  # its failure is flush's to raise, once
        for partition, generation in sorted(partitions.items()):
            target = self.producer_for(partition)
            if target is None or self.generation.get(partition, 0) != generation:
                continue  # revoked since: these writes are dropped, their records decided again
            self.written.add(partition)  # before the first write can start
            try:
                await self._send_partition(target, partition, generation, staged.get(partition),
                                           outputs.get(partition))
            except Exception as exc:
                if self.generation.get(partition, 0) == generation:
                    # flush raises it: the transaction lacks writes its offsets need (unless the
                    # partition is revoked before that flush: settle forgets it then)
                    raise WriteFailed(partition, generation) from exc
                log.info("a write into the transaction of partition %d failed after its revocation (the "
                         "transaction is aborted)", partition, exc_info=True)

    async def _send_partition(self, target: Target, partition: int, generation: int,
                              values: dict[bytes, bytes] | None, outputs: list[Record] | None) -> None:
        kafka, lock = target
        acks = self.unacked.setdefault(partition, [])
        if outputs:
            async with lock:
                acks.append(await self.outputs.enqueue_all(outputs, via=kafka, partition=partition))
        if values:
            last = await send_keyed(kafka, lock, (self.topic, partition), values.items())
            acks.append(asyncio.ensure_future(self._changelog_sent(partition, generation, last)))

    async def _changelog_sent(self, partition: int, generation: int, last: Awaitable[int]) -> None:
        offset = await last
        if self.generation.get(partition, 0) == generation:
            self.sent[partition] = max(self.sent.get(partition, -1), offset)

    async def flush(self) -> set[int]:
        """Send what is held, and wait until every write sent since the last flush is acknowledged.
        Called in the same step as the offsets to commit are taken; holds new writes from then on.
        Returns the partitions revoked meanwhile: their writes may have been dropped (a send skips
        a revoked partition), so their offsets must not be committed (their transactions are
        aborted at the rebalance). A failed write raises, and the caller must not commit these
        offsets ever after (_Consumer ends the worker). Cancelled, nothing is forgotten: the next
        flush waits for the same."""
        generations = dict(self.generation)
        self.holding = False
        self.send()
        self.holding = True
        if self.sends:
            await asyncio.wait(self.sends)  # no send starts while holding: the list stays as it is
        acks = [acknowledged for pending in self.unacked.values() for acknowledged in pending]
        outcomes = await asyncio.gather(*acks, return_exceptions=True) if acks else []
        sends, self.sends = self.sends, []
        self.unacked = {}
        for sent in sends:
            if self._still_failed(sent):
                raise asyncio.CancelledError() if sent.cancelled() else sent.exception()  # type: ignore[misc]
        for failed in outcomes:
            if isinstance(failed, BaseException):
                raise failed
        return {partition for partition, generation in self.generation.items()
                if generation != generations.get(partition, 0)}

    def commit_ended(self, transactions_open: bool) -> None:
        """A commit ended: the writes of batches decided meanwhile go into the new transactions,
        if there are new ones (none after the last commit of a stop)."""
        self.holding = not transactions_open
        self.send()

    def committed(self, partitions: set[int]) -> None:
        for partition in partitions:
            self.written.discard(partition)
            last = self.sent.pop(partition, None)
            self.store.write(partition, self.in_flight.pop(partition, {}).items(), last)

    def revoked(self, partitions: set[int]) -> None:
        """A revoked partition's staged writes and uncommitted offset are dropped. Writes already
        sent into its open transaction make it dirty: its producer is replaced at the rebalance
        (settle), which aborts the transaction, before the partition's records are decided again."""
        for partition in partitions:
            self.generation[partition] = self.generation.get(partition, 0) + 1
            if partition in self.written:  # a write may have reached its transaction
                self.dirty.add(partition)
            self.written.discard(partition)
            for staged in (self.pending, self.pending_outputs, self.in_flight, self.sent, self.unacked):
                staged.pop(partition, None)

    async def settle(self) -> set[int]:
        """At a rebalance, before producers are stopped or begun: wait until the sends under way
        are handed over (a later one would go into a new producer's transaction), and return the
        dirty partitions, whose open transactions must be aborted. A send that failed for a
        partition revoked since is forgotten (its transaction is aborted); any other failure stays
        for the next flush to raise."""
        if self.sends:
            await asyncio.wait(list(self.sends))
        self.sends = [sent for sent in self.sends if not sent.done() or self._still_failed(sent)]
        dirty, self.dirty = self.dirty, set()
        return dirty

    def _still_failed(self, sent: asyncio.Task[None]) -> bool:
        """Whether a finished send failed for a partition not revoked since."""
        if sent.cancelled():
            return True
        failed = sent.exception()
        if isinstance(failed, WriteFailed):
            return self.generation.get(failed.partition, 0) == failed.generation
        return failed is not None


ABORT_ON_STOP_S = 5.0  # an abort at a stop or a rebalance, at most (else the transaction times out)


class _Producer(faust_aiokafka.Producer):
    def _settings_extra(self) -> Mapping[str, Any]:
        """The transactional producers' timeout: Kafka Streams' 10 s, not Kafka's 60. A worker lost
        for good leaves its open transactions to the broker, which aborts them after this timeout:
        till then read_committed readers wait at their first record, and a new owner's recovery
        waits for them (a new owner under the same transactional id ends them at once: a transaction
        per partition, or the worker restarted under its member id). A transaction lasts one commit
        interval (at most half of this, app/settings.py); one that outlasts it is aborted, and its
        worker's commit fails: a restart, its records decided again."""
        extra = dict(super()._settings_extra())
        if self.app.in_transaction:
            extra["transaction_timeout_ms"] = int(TRANSACTION_TIMEOUT_S * 1000)
        return extra

    async def stop_transaction(self, transactional_id: str) -> None:
        """The producer's open transaction is aborted first: aiokafka's stop leaves it open, and
        read_committed readers would wait at its first record until its timeout (under a worker's
        own id no other worker's producer ends it; under a partition's, a worker of the other model
        in the group does not either)."""
        await _abort_open(self._transaction_producers.get(transactional_id), transactional_id)
        await _bounded(super().stop_transaction(transactional_id), f"stopping the producer {transactional_id}")

    async def on_stop(self) -> None:
        await abort_open(self, list(self._transaction_producers))
        await _bounded(super().on_stop(), "stopping the producers", 2 * ABORT_ON_STOP_S)

    def transactional(self, transactional_id: str) -> Target | None:
        """The transactional producer Faust keeps for ``transactional_id`` and its lock, if it has one."""
        producer = self._transaction_producers.get(transactional_id)
        return (producer, self._trn_locks[transactional_id]) if producer is not None else None

    async def commit_transactions(self, tid_to_offset_map: Any, group_id: str,
                                  start_new_transaction: bool = True) -> None:
        """Faust commits each partition's transaction after the previous one has finished, each a
        few round trips to the broker; they are independent (a producer each), so they go at once."""
        async def commit(transactional_id: str, offsets: Any) -> None:
            async with self._trn_locks.get(transactional_id) or contextlib.nullcontext():
                transactional = self._transaction_producers.get(transactional_id)
                if transactional is None:  # Faust would count it committed, and the store would take its values
                    raise RuntimeError(f"a commit was asked of {transactional_id}, a transaction this worker "
                                       "does not hold")
                await transactional.send_offsets_to_transaction(offsets, group_id)
                await transactional.commit_transaction()
                if start_new_transaction:
                    await transactional.begin_transaction()
        outcomes = await asyncio.gather(*(commit(tid, offsets) for tid, offsets in tid_to_offset_map.items()),
                                        return_exceptions=True)
        failed = {tid: outcome for tid, outcome in zip(tid_to_offset_map, outcomes, strict=True)
                  if isinstance(outcome, BaseException)}
        fenced = sorted(tid for tid, exc in failed.items() if isinstance(exc, ProducerFenced))
        if fenced:
            # Another worker owns these partitions now. Faust would crash the app but call the commit
            # done, and the local store would take the values of transactions that never committed
            # (ahead of the changelog: ConsistencyError at every start). Exit before it is written.
            exit_for_restart(FAILED_EXIT_CODE, "the transactional producers %s were fenced (another worker took "
                             "their partitions over, or the broker aborted a transaction open for its timeout, "
                             f"{TRANSACTION_TIMEOUT_S:g} s): exiting so that the supervisor restarts this worker, its "
                             "local store untouched by the commit", ", ".join(fenced))
        if failed:
            raise next(iter(failed.values()))


async def abort_open(producer: _Producer, transactional_ids: list[str]) -> None:
    """Abort the open transactions of these producers, all at once (each bounded: a broker away
    would make one after the other add up)."""
    await asyncio.gather(*(_abort_open(producer._transaction_producers.get(tid), tid) for tid in transactional_ids))


async def _bounded(stopping: Awaitable[None], what: str, limit_s: float | None = None) -> None:
    """A producer's stop, bounded: aiokafka's waits for its sender's pending end of a transaction,
    which looks for the transaction coordinator for as long as none answers (an abort that timed
    out leaves one). The transaction then ends at its timeout."""
    limit_s = ABORT_ON_STOP_S if limit_s is None else limit_s
    try:
        await asyncio.wait_for(stopping, limit_s)
    except TimeoutError:
        log.warning("%s took over %.0f s (the transaction coordinator away?): left behind, its open transaction "
                    "ends at its timeout", what, limit_s)


async def _abort_open(producer: AIOKafkaProducer | None, transactional_id: str) -> None:
    """Abort ``producer``'s transaction if one is open (best effort, bounded: else it times out)."""
    if producer is None or not producer._txn_manager.is_in_transaction():
        return
    try:
        await asyncio.wait_for(producer.abort_transaction(), ABORT_ON_STOP_S)
        log.info("aborted the open transaction of %s before stopping its producer", transactional_id)
    except Exception as exc:  # the broker away: the transaction ends at its timeout instead
        log.warning("could not abort the open transaction of %s (%r): it ends at its timeout", transactional_id, exc)


class _TransactionManager(TransactionManager):
    """Faust's, with the producers of partitions this worker no longer owns stopped at each rebalance.

    Faust works out the revoked partitions as the last assignment minus the new one, but the
    partitions are revoked before the new assignment is given (the eager protocol), so that set is
    empty and it never stopped a moved partition's producer: its transactional id, taken over by
    the new owner, is fenced, and when the partition came back the old producer was used again,
    which ended the worker (ProducerFenced, "Can't send messages while not in transaction") after
    the rebalance. And a kept partition's producer, in its open transaction since the last commit,
    is left as it is (Faust began a transaction in it again: a warning per partition)."""

    async def on_rebalance(self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP]) -> None:
        producer = producer_of(self.app)
        owned = self._tps_to_transactional_ids(assigned)
        state = getattr(self.app, "worker_state", None)  # the worker's (app/worker/shared.py)
        stage: TransactionStage | None = getattr(state, "stage", None)
        dirty = await stage.settle() if stage is not None else set()
        # a kept partition whose open transaction holds writes of records to be decided again
        aborted = {transactional_id(self.app, stage.topic, partition) for partition in dirty} if stage else set()
        producers = set(producer._transaction_producers)
        stale = sorted((producers - owned) | (aborted & producers))
        if stale:
            log.info("stopping the transactional producers of %d partitions this worker no longer owns or whose "
                     "open transactions hold writes of records to be decided again (a new producer aborts them): %s",
                     len(stale), ", ".join(stale))
            # Not under a commit: stopping a producer whose commit is in flight leaves that commit
            # waiting for ever (aiokafka never resolves its futures), and every later commit behind it.
            await self.consumer.maybe_wait_for_commit_to_finish()  # type: ignore[attr-defined]  # Faust's Consumer's
            await abort_open(producer, stale)  # all at once; stop_transaction then finds them ended
            for tid in stale:
                async with producer._trn_locks[tid]:
                    await producer.stop_transaction(tid)
        # Faust stops the producers of what it counts revoked (the last assignment minus this one),
        # without the lock or a wait for a commit under way; the worker's one producer is stopped
        # above when its transaction holds writes of revoked partitions, and kept otherwise.
        await super().on_rebalance(assigned, set() if worker_transactional_id(self.app) else revoked,
                                   newly_assigned)

    def _tps_to_transactional_ids(self, tps: set[TP]) -> set[str]:
        worker = worker_transactional_id(self.app)
        if worker is None:
            return set(super()._tps_to_transactional_ids(tps))
        return {worker} if tps else set()

    async def commit(self, offsets: Any, start_new_transaction: bool = True) -> bool:
        """The offsets carry the group membership they were taken in (app/worker/fencing.py). With
        one transaction per worker, every partition's offsets go into it (Faust's groups them by
        partition, each under its own transactional id)."""
        if not offsets:
            return True
        state = getattr(self.app, "worker_state", None)
        membership = state.commit_membership if state is not None else None
        if membership is None:
            raise fencing.FencedMemberError("a commit without the membership its offsets were taken in")
        worker = worker_transactional_id(self.app)
        with fencing.pinned(self.app.conf.id, membership):
            if worker is None:
                return bool(await super().commit(offsets, start_new_transaction))
            await producer_of(self.app).commit_transactions({worker: dict(offsets)}, self.app.conf.id,
                                                            start_new_transaction=start_new_transaction)
        return True

    async def _start_transactions(self, tids: Any) -> None:
        producer = producer_of(self.app)
        for transactional_id in tids:
            open_one = producer._transaction_producers.get(transactional_id)
            if open_one is not None and open_one._txn_manager.is_in_transaction():
                continue  # kept through the rebalance, its transaction open since the last commit
            await producer.maybe_begin_transaction(transactional_id)
            # Faust's begin logs and swallows every failure (a broker away during the rebalance, a
            # fenced id): without a transaction the partition's outputs would have nowhere to go
            # while its offsets were committed. A restart joins again and begins afresh.
            started = producer._transaction_producers.get(transactional_id)
            if started is None or not started._txn_manager.is_in_transaction():
                exit_for_restart(FAILED_EXIT_CODE, "the transactional producer %s could not begin its transaction "
                                 "(the log above says why): exiting so that the supervisor restarts this worker",
                                 transactional_id)


def transactional_id(app: AppT, topic: str, partition: int) -> str:
    """The transactional id of the producer that writes ``topic``'s ``partition``: the worker's
    own, or, without one, the partition's as Faust names it."""
    worker = worker_transactional_id(app)
    if worker is not None:
        return worker
    return f"{app.conf.id}-{app.assignor.group_for_topic(topic)}-{partition}"


def worker_transactional_id(app: AppT) -> str | None:
    """The transactional id of a worker that writes every partition in one transaction (see
    app/worker/fencing.py), or None: a transaction per partition."""
    return getattr(app, "transactional_id", None)


def producer_of(app: AppT) -> _Producer:
    """The worker's producer, as the transport that app.py gives its app creates it."""
    producer = app.producer
    if not isinstance(producer, _Producer):
        raise TypeError(f"the worker's app has {type(producer).__name__} for a producer, not _Producer")
    return producer
