"""Exactly-once: a batch's writes staged for its partition's Kafka transaction, committed concurrently (I/O shell)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import ProducerFenced
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, AppT

from app.core.dispatch import Record
from app.producer import KeyedProducer, send_keyed
from app.worker.exits import FAILED_EXIT_CODE, exit_for_restart
from app.worker.store import PartitionStore

log = logging.getLogger("orderly.worker")

# The producer that writes a partition's records, and the lock its sends take.
Target = tuple[AIOKafkaProducer, AbstractAsyncContextManager[Any]]


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
    instead of a produce request per partition's transactional producer in every batch, which
    made small batches much slower with exactly-once than with at-least-once. ``get`` reads the
    values not yet committed, which the worker consults before the table. The worker's consumer
    calls ``flush`` before Faust commits the transactions and ``committed`` after: every offset a
    commit covers was acked after its writes were staged, so they are in the transaction that
    commits the offset. ``committed`` also writes the store's changelog offset, which Faust's own
    exactly-once path never persists (it keeps it under the changelog partition and looks it up
    under the source partitions), so a restart reads on from local state."""

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


class _Producer(faust_aiokafka.Producer):
    def transactional(self, transactional_id: str) -> Target | None:
        """The transactional producer Faust keeps for ``transactional_id`` and its lock, if it has one."""
        producer = self._transaction_producers.get(transactional_id)
        return (producer, self._trn_locks[transactional_id]) if producer is not None else None

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
                             "their partitions over): exiting so that the supervisor restarts this worker, its "
                             "local store untouched by the commit", ", ".join(fenced))
        if failed:
            raise next(iter(failed.values()))


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
        stale = sorted(set(producer._transaction_producers) - owned)
        if stale:
            log.info("stopping the transactional producers of %d partitions this worker no longer owns: %s",
                     len(stale), ", ".join(stale))
            # Not under a commit: stopping a producer whose commit is in flight leaves that commit
            # waiting for ever (aiokafka never resolves its futures), and every later commit behind it.
            await self.consumer.maybe_wait_for_commit_to_finish()  # type: ignore[attr-defined]  # Faust's Consumer's
            for transactional_id in stale:
                async with producer._trn_locks[transactional_id]:
                    await producer.stop_transaction(transactional_id)
        await super().on_rebalance(assigned, revoked, newly_assigned)

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


def producer_of(app: AppT) -> _Producer:
    """The worker's producer, as the transport that app.py gives its app creates it."""
    producer = app.producer
    if not isinstance(producer, _Producer):
        raise TypeError(f"the worker's app has {type(producer).__name__} for a producer, not _Producer")
    return producer
