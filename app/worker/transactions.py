"""Exactly-once: a batch's writes staged for its partition's Kafka transaction, committed concurrently (I/O shell)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from app.core.dispatch import Record
from app.producer import KeyedProducer, send_keyed
from app.seams.faust import Target
from app.worker.store import PartitionStore

log = logging.getLogger("orderly.worker")


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
