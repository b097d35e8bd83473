"""Exactly-once's staged writes (app/worker/transactions.py TransactionStage) with stand-ins for
aiokafka's transactional producers: a batch's writes go into the open transaction as it ends, a
commit carries exactly the writes of the batches whose offsets it takes, those decided during a
commit wait for the next transaction, and a revoked partition's writes never reach a commit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError
from faust.transport.consumer import TransactionManager
from hypothesis import given, settings
from hypothesis import strategies as st

from app.producer import KeyedProducer
from app.seams.faust import producer as transactions
from app.seams.faust.producer import TransactionManager as WorkerTransactionManager
from app.worker.runtime import WorkerRuntime
from app.worker.transactions import TransactionStage, WriteFailed

CHANGELOG = "changelog"


class Builder:
    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []

    def append(self, *, key: bytes, value: bytes, timestamp: Any, headers: Any) -> object:
        self.records.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.records)


class Acked:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class Transactional:
    """One partition's transactional producer: what its open transaction holds, and its acks."""

    def __init__(self) -> None:
        self.open: list[tuple[str, bytes, bytes]] = []  # topic, key, value
        self.unacked: list[tuple[asyncio.Future[Any], int]] = []
        self.offset = 0

    def create_batch(self) -> Builder:
        return Builder()

    async def send_batch(self, builder: Builder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        await asyncio.sleep(0)  # handing over may suspend (aiokafka waits for room)
        self.open += [(topic, key, value) for key, value in builder.records]
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.unacked.append((done, self.offset))
        self.offset += len(builder.records)
        return done

    def ack(self) -> None:
        for done, offset in self.unacked:
            done.set_result(Acked(offset))
        self.unacked = []

    def commit(self) -> list[tuple[str, bytes, bytes]]:
        committed, self.open = self.open, []
        return committed


class Store:
    def __init__(self) -> None:
        self.writes: list[tuple[int, dict[bytes, bytes], int | None]] = []

    def write(self, partition: int, values: Any, offset: int | None) -> None:
        self.writes.append((partition, dict(values), offset))


def stage_for(partitions: int) -> tuple[TransactionStage, list[Transactional], Store]:
    producers = [Transactional() for _ in range(partitions)]
    locks = [asyncio.Lock() for _ in range(partitions)]
    store = Store()
    stage = TransactionStage(CHANGELOG, lambda p: (producers[p], locks[p]),
                             store, KeyedProducer("unused:9092"))  # type: ignore[arg-type]
    return stage, producers, store


def decide(stage: TransactionStage, batch: int, partitions: list[int]) -> None:
    """A batch as BatchProcessor.decide leaves it: outputs and values staged, then sent."""
    for p in partitions:
        stage.stage_outputs(p, [("decisions", f"r{p}".encode(), f"b{batch}".encode())])
        stage.stage(p, f"r{p}".encode(), f"b{batch}".encode())
    stage.send()


async def settle_loop() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_batch_goes_into_the_open_transaction_as_it_ends_and_a_flush_waits_for_its_acks() -> None:
    stage, (kafka,), store = stage_for(1)
    decide(stage, 1, [0])
    await settle_loop()
    assert kafka.open == [("decisions", b"r0", b"b1"), (CHANGELOG, b"r0", b"b1")]
    assert stage.get(0, b"r0") == b"b1"  # read before the table until committed
    flush = asyncio.ensure_future(stage.flush())
    await settle_loop()
    assert not flush.done()  # not acknowledged yet
    kafka.ack()
    await flush
    stage.committed({0})
    assert store.writes == [(0, {b"r0": b"b1"}, 1)]  # the changelog record's offset (outputs took 0)
    assert stage.get(0, b"r0") is None


async def test_a_batch_decided_during_a_commit_waits_for_the_next_transaction() -> None:
    stage, (kafka,), _ = stage_for(1)
    decide(stage, 1, [0])
    flush = asyncio.ensure_future(stage.flush())  # the commit takes batch 1's offsets
    await settle_loop()
    decide(stage, 2, [0])
    await settle_loop()
    kafka.ack()
    await flush
    assert [value for _, _, value in kafka.commit()] == [b"b1", b"b1"]  # batch 2 is not in this commit
    stage.committed({0})
    assert stage.get(0, b"r0") == b"b2"  # still staged
    stage.commit_ended(transactions_open=True)
    await settle_loop()
    assert [value for _, _, value in kafka.open] == [b"b2", b"b2"]


async def test_after_the_last_commit_of_a_stop_nothing_is_sent() -> None:
    stage, (kafka,), _ = stage_for(1)
    decide(stage, 1, [0])
    flush = asyncio.ensure_future(stage.flush())
    await settle_loop()
    kafka.ack()
    await flush
    kafka.commit()
    stage.committed({0})
    stage.commit_ended(transactions_open=False)
    decide(stage, 2, [0])
    await settle_loop()
    assert kafka.open == []


async def test_a_revoked_partition_is_dirty_its_writes_dropped_and_its_later_sends_skipped() -> None:
    stage, (k0, k1), store = stage_for(2)
    decide(stage, 1, [0, 1])
    await settle_loop()
    assert k0.open and k1.open
    decide(stage, 2, [0])
    stage.revoked({0})  # before batch 2's send ran: it sends nothing for partition 0
    assert await stage.settle() == {0}  # its transaction holds batch 1's writes: to be aborted
    assert [value for _, _, value in k0.open] == [b"b1", b"b1"]
    k0.ack()
    k1.ack()
    await stage.flush()
    stage.committed({1})
    assert store.writes == [(1, {b"r1": b"b1"}, 1)]
    assert stage.sent == {} and stage.get(0, b"r0") is None


async def test_a_partition_revoked_with_nothing_sent_is_not_dirty() -> None:
    stage, _, _ = stage_for(2)
    stage.revoked({0, 1})
    assert await stage.settle() == set()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["decide0", "decide1", "decide01", "step", "commit", "ack"]), max_size=40))
def test_every_commit_carries_exactly_the_writes_of_the_batches_its_offsets_cover(actions: list[str]) -> None:
    """Whatever the interleaving of batches, sends, acks and commits: each commit's transaction
    holds, per partition, the outputs of exactly the batches decided before its offsets were taken
    and after the previous commit's, and their changelog values in the order decided (those staged
    together as one record, the latest); the store gets each committed partition's last values."""

    async def run() -> None:
        stage, producers, store = stage_for(2)
        decided: list[tuple[int, list[int]]] = []  # every batch, in order
        covered = 0  # batches the commits so far took
        batch = 0
        flush: asyncio.Future[set[int]] | None = None
        taken = 0

        async def finish_commit() -> None:
            nonlocal flush, covered
            assert flush is not None
            for _ in range(1000):  # Kafka acknowledges whatever is sent, until the flush is through
                if flush.done():
                    break
                for kafka in producers:
                    kafka.ack()
                await asyncio.sleep(0)
            await flush
            for p, kafka in enumerate(producers):
                expected = [f"b{b}".encode() for b, parts in decided[covered:taken] if p in parts]
                committed = kafka.commit()
                assert [v for topic, _, v in committed if topic == "decisions"] == expected
                changelog = [v for topic, _, v in committed if topic == CHANGELOG]
                # values staged together are one record, the latest: in order, ending on the last
                assert changelog == sorted(set(changelog), key=expected.index)
                assert changelog[-1:] == expected[-1:]
            stage.committed({0, 1})
            covered = taken
            stage.commit_ended(transactions_open=True)
            flush = None

        for action in [*actions, "commit", "commit"]:
            if action.startswith("decide"):
                batch += 1
                parts = [int(c) for c in action[len("decide"):]]
                decided.append((batch, parts))
                decide(stage, batch, parts)
            elif action == "step":
                await asyncio.sleep(0)
            elif action == "ack":
                for kafka in producers:
                    kafka.ack()
            elif flush is None:  # commit: offsets taken and the flush begun in one step
                taken = len(decided)
                flush = asyncio.ensure_future(stage.flush())
                await asyncio.sleep(0)
            else:
                await finish_commit()
        if flush is not None:
            await finish_commit()
        last: dict[int, bytes] = {}
        for b, parts in decided[:covered]:
            for p in parts:
                last[p] = f"b{b}".encode()
        stored: dict[int, bytes] = {}
        for p, values, _ in store.writes:
            for value in values.values():  # one resource per partition
                stored[p] = value
        assert stored == last

    asyncio.run(run())


async def test_a_rebalance_replaces_the_producers_whose_transactions_hold_dropped_writes(monkeypatch: Any) -> None:
    stage, _, _ = stage_for(2)
    stage.dirty = {1}
    stopped: list[str] = []
    aborted: list[str] = []

    class Producer(transactions.Producer):
        async def stop_transaction(self, transactional_id: str) -> None:
            stopped.append(transactional_id)

    class Transactional:
        """An aiokafka producer in its open transaction (Faust begins one at once)."""

        def __init__(self, tid: str) -> None:
            self.tid, self.open = tid, True
            self._txn_manager = type("Manager", (), {"is_in_transaction": lambda manager: self.open})()

        async def abort_transaction(self) -> None:
            aborted.append(self.tid)
            self.open = False

    producer = object.__new__(Producer)
    producer._transaction_producers = {tid: Transactional(tid) for tid in ("w-0-0", "w-0-1", "w-0-2")}
    producer._trn_locks = {tid: asyncio.Lock() for tid in producer._transaction_producers}
    app = type("App", (), {})()
    app.producer = producer
    runtime = object.__new__(WorkerRuntime)  # what the worker's runtime answers the seam (settle)
    runtime.app, runtime.state = app, type("State", (), {"stage": stage})()
    app.hooks = runtime
    app.conf = type("Conf", (), {"id": "w"})()
    app.assignor = type("Assignor", (), {"group_for_topic": staticmethod(lambda topic: 0)})()
    manager = object.__new__(WorkerTransactionManager)
    manager.app = app
    manager.consumer = type("Consumer", (), {"maybe_wait_for_commit_to_finish": staticmethod(
        lambda: asyncio.sleep(0))})()
    monkeypatch.setattr(manager, "_tps_to_transactional_ids", lambda tps: {"w-0-0", "w-0-1"}, raising=False)

    async def parent_on_rebalance(self: Any, assigned: Any, revoked: Any, newly_assigned: Any) -> None:
        pass
    monkeypatch.setattr(TransactionManager, "on_rebalance", parent_on_rebalance)
    await manager.on_rebalance(set(), set(), set())
    assert stopped == ["w-0-1", "w-0-2"]  # the dirty one it keeps, and the one it no longer owns
    # their open transactions aborted first (aiokafka's stop leaves them to the transaction timeout)
    assert sorted(aborted) == ["w-0-1", "w-0-2"]
    assert stage.dirty == set()


async def test_a_failed_write_fails_every_flush_after_its_acks_were_all_awaited() -> None:
    """The flush raises a send's failure and an ack's, having awaited every other ack (none left
    unretrieved); the consumer then ends the worker (below) instead of committing."""
    stage, (k0, k1), _ = stage_for(2)
    real = k0.send_batch

    async def refused(builder: Builder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        raise KafkaTimeoutError()
    k0.send_batch = refused  # type: ignore[method-assign]
    decide(stage, 1, [0, 1])
    flush = asyncio.ensure_future(stage.flush())
    await settle_loop()
    k1.ack()
    with pytest.raises(WriteFailed, match="partition 0") as failed:
        await flush
    assert isinstance(failed.value.__cause__, KafkaTimeoutError)
    k0.send_batch = real  # type: ignore[method-assign]
    decide(stage, 2, [0])
    flush = asyncio.ensure_future(stage.flush())
    await settle_loop()
    k0.unacked[0][0].set_exception(KafkaTimeoutError())
    k0.unacked = k0.unacked[1:]
    k0.ack()
    with pytest.raises(KafkaTimeoutError):
        await flush


class Exited(Exception):
    pass


def member_of_generation(monkeypatch: Any, consumer: Any, state: Any, generation: int,
                         assigned: int | None = None) -> None:
    """The worker's consumer a member of ``generation`` of its group; its partitions assigned in
    ``assigned`` (the same generation unless given)."""
    from app.seams.aiokafka import Membership

    monkeypatch.setattr(consumer, "membership", lambda: Membership(generation, "member-1", None), raising=False)
    state.assigned_generation = generation if assigned is None else assigned


def worker_consumer(state: Any) -> Any:
    """The seam's consumer of a worker whose commits are app/worker/commit.py's, over ``state``."""
    from app.seams.faust.consumer import Consumer
    from app.worker.commit import Commit

    consumer = object.__new__(Consumer)
    consumer.in_transaction = True
    consumer.app = type("App", (), {"hooks": type("Hooks", (), {"commit_offsets": Commit(state, False).run})()})()
    return consumer


def exiting_consumer(monkeypatch: Any, stage: Any, generation: int,
                     assigned: int | None = None) -> tuple[Any, Any, list[int]]:
    """An exactly-once consumer whose worker decided raw[0] up to 5 (committed up to 1), a member
    of ``generation`` (its partitions assigned in ``assigned``), whose exits are recorded and raise
    Exited: (consumer, its worker state, the exit codes)."""
    from aiokafka import TopicPartition

    from app.worker import commit as commit_module

    codes: list[int] = []

    def fake_exit(code: int, message: str, *args: Any, **kwargs: Any) -> None:
        codes.append(code)
        raise Exited(message % args)
    monkeypatch.setattr(commit_module, "exit_for_restart", fake_exit)
    state = type("State", (), {})()
    state.stage = stage
    state.decided = {TopicPartition("raw", 0): 5}
    state.metrics = type("Metrics", (), {})()
    consumer = worker_consumer(state)
    member_of_generation(monkeypatch, consumer, state, generation, assigned)
    consumer._committed_offset = {TopicPartition("raw", 0): 1}
    return consumer, state, codes


async def test_a_failed_exactly_once_commit_ends_the_worker_before_anything_commits_again(
        monkeypatch: Any) -> None:
    """Faust would crash the app on the failure, and its stop would commit once more: the offsets
    of the batch whose writes failed, without them."""
    from aiokafka import TopicPartition

    from app.worker.exits import FAILED_EXIT_CODE

    ended: list[bool] = []

    class Stage:

        async def flush(self) -> None:
            raise KafkaTimeoutError()

        def commit_ended(self, transactions_open: bool) -> None:
            ended.append(transactions_open)

    consumer, _, codes = exiting_consumer(monkeypatch, Stage(), 3)
    with pytest.raises(Exited, match="commit failed"):
        await consumer._commit_offsets({TopicPartition("raw", 0): 5})
    assert codes == [FAILED_EXIT_CODE]
    assert ended == []  # nothing sent into the transactions after the failure


async def test_an_exactly_once_commit_that_never_finishes_ends_the_worker_at_its_deadline(
        monkeypatch: Any) -> None:
    """A commit whose transaction outlived any transaction's life can no longer succeed, and every
    later commit (a revocation's, a stop's) waits for it: once seen in CI, the worker waited for ever."""
    from aiokafka import TopicPartition

    from app.worker import commit as commit_module
    from app.worker.exits import FAILED_EXIT_CODE

    monkeypatch.setattr(commit_module, "COMMIT_DEADLINE_S", 0.2)

    class Stage:
        written: frozenset[int] = frozenset()

        async def flush(self) -> set[int]:
            await asyncio.sleep(3600)  # a broker that never answers
            return set()

        def commit_ended(self, transactions_open: bool) -> None:
            raise AssertionError("nothing may go into a new transaction")

    consumer, _, codes = exiting_consumer(monkeypatch, Stage(), 3)
    with pytest.raises(Exited, match=r"commit failed: it did not finish within 0\.2 s"):
        await asyncio.wait_for(consumer._commit_offsets({TopicPartition("raw", 0): 5}), 10)
    assert codes == [FAILED_EXIT_CODE]


async def test_an_offset_commit_that_never_finishes_ends_an_at_least_once_worker_at_its_deadline(
        monkeypatch: Any) -> None:
    """At-least-once, aiokafka retries an offset commit while Kafka answers that it may: a
    coordinator never reachable again would hold this commit, and every later one, for ever."""
    from aiokafka import TopicPartition

    from app.seams.faust.consumer import Consumer
    from app.worker import commit as commit_module
    from app.worker.exits import FAILED_EXIT_CODE

    monkeypatch.setattr(commit_module, "OFFSET_COMMIT_DEADLINE_S", 0.5)
    answered: list[float] = []

    async def faust_commit(self: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        await asyncio.sleep(answered.pop(0) if answered else 3600)  # a coordinator that never answers
        return True

    monkeypatch.setattr(Consumer, "faust_commit_offsets", faust_commit)
    consumer, state, codes = exiting_consumer(monkeypatch, None, 3)
    consumer.in_transaction = False
    state.metrics.commit_seconds = type("Histogram", (), {"observe": lambda self, value: None})()
    consumer.committed_offsets = lambda: {TopicPartition("raw", 0): 1}
    answered.append(0.01)  # one that answers in time commits, and the worker goes on
    assert await consumer._commit_offsets({TopicPartition("raw", 0): 5}) is True and codes == []
    with pytest.raises(Exited, match=r"offset commit did not finish within 0\.5 s"):
        await asyncio.wait_for(consumer._commit_offsets({TopicPartition("raw", 0): 5}), 10)
    assert codes == [FAILED_EXIT_CODE]


async def test_a_timeout_of_the_offset_commit_itself_is_not_taken_for_the_deadline(monkeypatch: Any) -> None:
    """A TimeoutError raised inside the commit (a request's) goes to Faust as before: the worker
    does not exit saying the commit outlived a deadline it did not reach."""
    from aiokafka import TopicPartition

    from app.seams.faust.consumer import Consumer

    async def faust_commit(self: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        raise TimeoutError("a request timed out")

    monkeypatch.setattr(Consumer, "faust_commit_offsets", faust_commit)
    consumer, state, codes = exiting_consumer(monkeypatch, None, 3)
    consumer.in_transaction = False
    state.metrics.commit_seconds = type("Histogram", (), {"observe": lambda self, value: None})()
    consumer.committed_offsets = lambda: {TopicPartition("raw", 0): 1}
    with pytest.raises(TimeoutError, match="a request timed out"):
        await consumer._commit_offsets({TopicPartition("raw", 0): 5})
    assert codes == []


async def test_a_partition_written_but_left_out_of_a_commit_is_dirty_when_revoked() -> None:
    """Outputs only (a set-aside record changes no state), flushed, but the commit left the
    partition out (Faust drops a partition no longer in the assignment): its open transaction
    still holds them."""
    stage, (kafka,), _ = stage_for(1)
    stage.stage_outputs(0, [("quarantine", b"r0", b"bad")])
    stage.send()
    flush = asyncio.ensure_future(stage.flush())
    await settle_loop()
    kafka.ack()
    await flush
    stage.commit_ended(transactions_open=True)  # committed() not called for partition 0
    stage.revoked({0})
    assert await stage.settle() == {0}


async def test_a_write_that_failed_for_a_partition_revoked_since_fails_no_flush() -> None:
    """Every rebalance revokes every partition (the eager protocol): a write that failed before or
    while its partition was revoked only concerns a transaction that the rebalance aborts."""
    stage, (k0, k1), _ = stage_for(2)
    release = asyncio.Event()

    async def refused_later(builder: Builder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        await release.wait()
        raise KafkaTimeoutError()
    k0.send_batch = refused_later  # type: ignore[method-assign]
    k1.send_batch = refused_later  # type: ignore[method-assign]
    decide(stage, 1, [0])
    await settle_loop()
    stage.revoked({0})  # while its write is under way
    release.set()
    decide(stage, 2, [1])
    await settle_loop()  # partition 1's write fails before its revocation
    stage.revoked({1})
    assert await stage.settle() == {0, 1}
    assert await stage.flush() == set()  # nothing to raise, nothing revoked during it


async def test_a_partition_revoked_while_a_commit_flushes_is_left_out_of_that_commit() -> None:
    """The commit took the partition's offsets; its batch's send had not reached it yet when the
    revocation came, and skipped it: committing those offsets would lose the batch's writes."""
    stage, (k0, k1), _ = stage_for(2)
    release = asyncio.Event()
    real = k0.send_batch

    async def slow(builder: Builder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        await release.wait()  # aiokafka waits for room while the partition's last batch drains
        return await real(builder, topic, partition=partition)
    k0.send_batch = slow  # type: ignore[method-assign]
    decide(stage, 1, [0, 1])
    flush = asyncio.ensure_future(stage.flush())
    await settle_loop()
    decide(stage, 2, [1])  # held: a commit is under way
    stage.revoked({1})
    release.set()
    for _ in range(100):
        if flush.done():
            break
        k0.ack()
        k1.ack()
        await asyncio.sleep(0)
    assert await flush == {1}


async def test_the_consumer_commits_no_offsets_of_a_partition_revoked_during_the_flush(monkeypatch: Any) -> None:
    from aiokafka import TopicPartition
    from faust.transport import consumer as faust_consumer

    committed_offsets: list[dict[Any, int]] = []

    async def faust_commit(self: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        committed_offsets.append(dict(offsets))
        return True
    monkeypatch.setattr(faust_consumer.Consumer, "_commit_offsets", faust_commit)

    stored: list[set[int]] = []

    class Stage:
        async def flush(self) -> set[int]:
            return {1}  # revoked while the writes were flushed

        def committed(self, partitions: set[int]) -> None:
            stored.append(partitions)

        def commit_ended(self, transactions_open: bool) -> None:
            pass

    raw0, raw1 = TopicPartition("raw", 0), TopicPartition("raw", 1)
    stage = Stage()
    state = type("State", (), {})()
    state.stage = stage
    state.decided = {raw0: 5, raw1: 7}
    state.metrics = type("Metrics", (), {"commit_seconds": type("H", (), {"observe": lambda self, v: None})()})()
    consumer = worker_consumer(state)
    member_of_generation(monkeypatch, consumer, state, 3)
    consumer._committed_offset = {raw0: 1, raw1: 1}
    monkeypatch.setattr(consumer, "assignment", lambda: {raw0, raw1}, raising=False)
    assert await consumer._commit_offsets({raw0: 5, raw1: 7})
    assert committed_offsets == [{raw0: 5}]
    assert stored == [{0}]


@pytest.mark.parametrize("assigned", [4, None])
async def test_offsets_decided_under_another_generation_than_the_groups_are_never_committed(
        monkeypatch: Any, assigned: int | None) -> None:
    """Faust skips its revocation signal while it stops, or when its handler failed: the decided
    offsets then belong to an assignment of an earlier generation than the one the consumer joined
    since, and carrying the new generation the coordinator would accept them (assigned None: a
    revocation handled, and no assignment yet)."""
    from aiokafka import TopicPartition

    from app.worker.exits import FAILED_EXIT_CODE

    flushed: list[bool] = []

    class Stage:
        async def flush(self) -> set[int]:
            flushed.append(True)
            return set()

    consumer, state, codes = exiting_consumer(monkeypatch, Stage(), 5, assigned)
    state.assigned_generation = assigned  # None too: a revocation handled, no assignment since
    with pytest.raises(Exited, match="commit failed"):
        await consumer._commit_offsets({TopicPartition("raw", 0): 5})
    assert codes == [FAILED_EXIT_CODE]
    assert flushed == []  # nothing of the transaction sent on, nothing committed
    assert state.commit_membership.generation == 5


async def test_a_stopped_producer_aborts_its_open_transaction_first_and_a_stuck_stop_is_bounded(
        monkeypatch: Any) -> None:
    """aiokafka's stop leaves an open transaction to its timeout (read_committed readers wait at its
    first record meanwhile), and waits for ever for a coordinator that does not answer."""
    from faust.transport.drivers import aiokafka as faust_aiokafka

    monkeypatch.setattr(transactions, "ABORT_ON_STOP_S", 0.05)
    events: list[str] = []

    class Transactional:
        def __init__(self, tid: str, abort_hangs: bool = False) -> None:
            self.tid, self.open, self.abort_hangs = tid, True, abort_hangs
            self._txn_manager = type("Manager", (), {"is_in_transaction": lambda manager: self.open})()

        async def abort_transaction(self) -> None:
            if self.abort_hangs:
                await asyncio.sleep(3600)  # the coordinator away
            events.append(f"abort {self.tid}")
            self.open = False

        async def stop(self) -> None:
            if self.abort_hangs:
                await asyncio.sleep(3600)  # aiokafka waits for its sender's pending end of the transaction
            events.append(f"stop {self.tid}")

    producer = object.__new__(transactions.Producer)
    producer._transaction_producers = {"w-0": Transactional("w-0"), "w-1": Transactional("w-1", abort_hangs=True)}
    await asyncio.wait_for(producer.stop_transaction("w-0"), 5)
    assert events == ["abort w-0", "stop w-0"]
    await asyncio.wait_for(producer.stop_transaction("w-1"), 5)  # bounded: abort and stop given up
    assert events == ["abort w-0", "stop w-0"] and not producer._transaction_producers

    async def faust_on_stop(self: Any) -> None:
        for tp in self._transaction_producers.values():
            await tp.stop()
    monkeypatch.setattr(faust_aiokafka.Producer, "on_stop", faust_on_stop)
    events.clear()
    producer._transaction_producers = {"w-2": Transactional("w-2"), "w-3": Transactional("w-3", abort_hangs=True),
                                       "w-4": Transactional("w-4")}
    await asyncio.wait_for(producer.on_stop(), 5)
    assert sorted(e for e in events if e.startswith("abort")) == ["abort w-2", "abort w-4"]
    assert events.index("abort w-4") < events.index("stop w-2")  # every abort before the producers stop
