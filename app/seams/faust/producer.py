"""Faust's transactional producers and transaction manager as the exactly-once worker runs them:
bounded stops that abort first, concurrent commits, producers replaced at each rebalance and the
commit's pinned group membership (seam layer over faust-streaming 0.15.3).

Paths and line numbers are of faust-streaming 0.15.3, faust/transport/drivers/aiokafka.py (Producer)
and faust/transport/consumer.py (TransactionManager); tests/unit/test_seams_faust.py checks them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import ProducerFenced
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, AppT

from app.seams import aiokafka as kafka_seam
from app.seams.faust.app import WorkerHooks, hooks_of, worker_transactional_id
from app.settings import TRANSACTION_TIMEOUT_S
from app.waits import within

log = logging.getLogger("orderly.worker")

# The producer that writes a partition's records, and the lock its sends take.
Target = tuple[AIOKafkaProducer, AbstractAsyncContextManager[Any]]


def worker_hooks(app: AppT) -> WorkerHooks:
    """The worker's hooks: this module's classes serve only the worker's app."""
    hooks = hooks_of(app)
    if hooks is None:
        raise TypeError(f"{type(app).__name__} is not the worker's app with its hooks")
    return hooks


ABORT_ON_STOP_S = 5.0  # an abort at a stop or a rebalance, at most (else the transaction times out)


class Producer(faust_aiokafka.Producer):
    # Relied on: Producer._transaction_producers and _trn_locks (drivers/aiokafka.py lines 1175-1176,
    # transactional id -> its aiokafka producer, and the lock Faust's sends and commits take),
    # _settings_extra (line 1323: extra settings of every producer it creates), stop_transaction
    # (line 1281), commit_transactions (line 1293).
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
            worker_hooks(self.app).fail("the transactional producers %s were fenced (another worker took "
                             "their partitions over, or the broker aborted a transaction open for its timeout, "
                             f"{TRANSACTION_TIMEOUT_S:g} s): exiting so that the supervisor restarts this worker, its "
                             "local store untouched by the commit", ", ".join(fenced))
        if failed:
            raise next(iter(failed.values()))


async def abort_open(producer: Producer, transactional_ids: list[str]) -> None:
    """Abort the open transactions of these producers, all at once (each bounded: a broker away
    would make one after the other add up)."""
    await asyncio.gather(*(_abort_open(producer._transaction_producers.get(tid), tid) for tid in transactional_ids))


async def _bounded(stopping: Awaitable[None], what: str, limit_s: float | None = None) -> None:
    """A producer's stop, bounded: aiokafka's waits for its sender's pending end of a transaction,
    which looks for the transaction coordinator for as long as none answers (an abort that timed
    out leaves one). The transaction then ends at its timeout."""
    limit_s = ABORT_ON_STOP_S if limit_s is None else limit_s
    try:
        await within(stopping, limit_s)
    except TimeoutError:
        log.warning("%s took over %.0f s (the transaction coordinator away?): left behind, its open transaction "
                    "ends at its timeout", what, limit_s)


async def _abort_open(producer: AIOKafkaProducer | None, transactional_id: str) -> None:
    """Abort ``producer``'s transaction if one is open (best effort, bounded: else it times out)."""
    if producer is None or not kafka_seam.in_transaction(producer):
        return
    try:
        await within(producer.abort_transaction(), ABORT_ON_STOP_S)
        log.info("aborted the open transaction of %s before stopping its producer", transactional_id)
    except Exception as exc:  # the broker away: the transaction ends at its timeout instead
        log.warning("could not abort the open transaction of %s (%r): it ends at its timeout", transactional_id, exc)


class TransactionManager(faust_consumer.TransactionManager):
    """Faust's, with the producers of partitions this worker no longer owns stopped at each rebalance.

    Faust works out the revoked partitions as the last assignment minus the new one, but the
    partitions are revoked before the new assignment is given (the eager protocol), so that set is
    empty and it never stopped a moved partition's producer: its transactional id, taken over by
    the new owner, is fenced, and when the partition came back the old producer was used again,
    which ended the worker (ProducerFenced, "Can't send messages while not in transaction") after
    the rebalance. And a kept partition's producer, in its open transaction since the last commit,
    is left as it is (Faust began a transaction in it again: a warning per partition)."""

    # Relied on: TransactionManager.on_rebalance (transport/consumer.py line 223, called with the
    # assignment at each rebalance), _start_transactions (line 258), _tps_to_transactional_ids (line
    # 264), commit (Consumer._commit_offsets calls it with the offsets), and Faust's
    # Consumer.maybe_wait_for_commit_to_finish (line 963).

    async def on_rebalance(self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP]) -> None:
        producer = producer_of(self.app)
        owned = self._tps_to_transactional_ids(assigned)
        # a kept partition whose open transaction holds writes of records to be decided again
        aborted = await worker_hooks(self.app).settle()
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
        """The offsets carry the group membership they were taken in (app/seams/aiokafka.py). With
        one transaction per worker, every partition's offsets go into it (Faust's groups them by
        partition, each under its own transactional id)."""
        if not offsets:
            return True
        membership = worker_hooks(self.app).commit_membership()
        if membership is None:
            raise kafka_seam.FencedMemberError("a commit without the membership its offsets were taken in")
        worker = worker_transactional_id(self.app)
        with kafka_seam.pinned(self.app.conf.id, membership):
            if worker is None:
                return bool(await super().commit(offsets, start_new_transaction))
            await producer_of(self.app).commit_transactions({worker: dict(offsets)}, self.app.conf.id,
                                                            start_new_transaction=start_new_transaction)
        return True

    async def _start_transactions(self, tids: Any) -> None:
        producer = producer_of(self.app)
        for transactional_id in tids:
            open_one = producer._transaction_producers.get(transactional_id)
            if open_one is not None and kafka_seam.in_transaction(open_one):
                continue  # kept through the rebalance, its transaction open since the last commit
            await producer.maybe_begin_transaction(transactional_id)
            # Faust's begin logs and swallows every failure (a broker away during the rebalance, a
            # fenced id): without a transaction the partition's outputs would have nowhere to go
            # while its offsets were committed. A restart joins again and begins afresh.
            started = producer._transaction_producers.get(transactional_id)
            if started is None or not kafka_seam.in_transaction(started):
                worker_hooks(self.app).fail("the transactional producer %s could not begin its transaction "
                                 "(the log above says why): exiting so that the supervisor restarts this worker",
                                 transactional_id)


def transactional_id(app: AppT, topic: str, partition: int) -> str:
    """The transactional id of the producer that writes ``topic``'s ``partition``: the worker's
    own, or, without one, the partition's as Faust names it."""
    worker = worker_transactional_id(app)
    if worker is not None:
        return worker
    return f"{app.conf.id}-{app.assignor.group_for_topic(topic)}-{partition}"


def producer_of(app: AppT) -> Producer:
    """The worker's producer, as the transport that app.py gives its app creates it."""
    producer = app.producer
    if not isinstance(producer, Producer):
        raise TypeError(f"the worker's app has {type(producer).__name__} for a producer, not the seam's Producer")
    return producer
