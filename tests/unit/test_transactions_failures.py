"""Exactly-once failure paths of the worker's transactional producers (app/seams/faust/producer.py),
with stand-ins for aiokafka's producers: a fenced commit ends the worker before the local store
takes the values, a transaction that could not begin ends it too, and a revoked partition's
decided offsets go with its staged writes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, ProducerFenced

from app.seams.faust.producer import Producer, TransactionManager
from app.worker import runtime
from app.worker.exits import FAILED_EXIT_CODE


class Exited(Exception):
    pass


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    codes: list[int] = []

    def fake_exit(code: int, message: str, *args: Any, **kwargs: Any) -> None:
        codes.append(code)
        raise Exited(message % args)
    monkeypatch.setattr(runtime, "exit_for_restart", fake_exit)  # the worker's hooks' fail()
    return codes


class FakeTxnState:
    def __init__(self, open_: bool) -> None:
        self.open = open_

    def is_in_transaction(self) -> bool:
        return self.open


class FakeTransactional:
    def __init__(self, fail: BaseException | None = None, in_transaction: bool = True) -> None:
        self.fail = fail
        self.committed = False
        self.stopped = False
        self._txn_manager = FakeTxnState(in_transaction)

    async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
        await asyncio.sleep(0)

    async def commit_transaction(self) -> None:
        if self.fail is not None:
            raise self.fail
        self.committed = True

    async def begin_transaction(self) -> None:
        self._txn_manager.open = True

    async def stop(self) -> None:
        self.stopped = True


def producer_with(**transactional: FakeTransactional) -> Producer:
    producer = object.__new__(Producer)  # no Faust service: only the maps the methods use
    producer._transaction_producers = dict(transactional)
    producer._trn_locks = {tid: asyncio.Lock() for tid in transactional}
    producer.app = worker_app()
    return producer


def worker_app(**attributes: Any) -> Any:
    """An app whose hooks are the worker's runtime (its fail() ends the worker)."""
    return type("App", (), {"hooks": object.__new__(runtime.WorkerRuntime), **attributes})()


def test_a_fenced_commit_exits_before_the_caller_can_write_the_store(exits: list[int]) -> None:
    ok, fenced = FakeTransactional(), FakeTransactional(fail=ProducerFenced())
    producer = producer_with(a=ok, b=fenced)
    with pytest.raises(Exited, match="fenced"):
        asyncio.run(producer.commit_transactions({"a": {}, "b": {}}, "group"))
    assert exits == [FAILED_EXIT_CODE]
    assert ok.committed  # the other partition's commit was not cut half-way


def test_another_commit_failure_is_raised_after_every_commit_ended(exits: list[int]) -> None:
    ok, slow = FakeTransactional(), FakeTransactional(fail=KafkaTimeoutError())
    producer = producer_with(a=slow, b=ok)
    with pytest.raises(KafkaTimeoutError):
        asyncio.run(producer.commit_transactions({"a": {}, "b": {}}, "group"))
    assert exits == [] and ok.committed


def test_a_transaction_that_did_not_begin_ends_the_worker(exits: list[int]) -> None:
    manager = object.__new__(TransactionManager)
    producer = producer_with(kept=FakeTransactional(in_transaction=True))

    async def begin_swallowing_failures(tid: str) -> None:  # Faust's: it logs and swallows every error
        if tid == "new-ok":
            producer._transaction_producers[tid] = FakeTransactional(in_transaction=True)
            producer._trn_locks[tid] = asyncio.Lock()

    producer.maybe_begin_transaction = begin_swallowing_failures  # type: ignore[method-assign,assignment]
    manager.app = worker_app(producer=producer)
    asyncio.run(manager._start_transactions(["kept", "new-ok"]))
    assert exits == []
    with pytest.raises(Exited, match="new-broken"):
        asyncio.run(manager._start_transactions(["new-broken"]))
    assert exits == [FAILED_EXIT_CODE]


def test_a_revoked_partition_drops_its_decided_offsets_with_its_staged_writes() -> None:
    from app.worker.batch import BatchProcessor

    class Stage:
        def __init__(self) -> None:
            self.dropped: set[int] = set()

        def revoked(self, partitions: set[int]) -> None:
            self.dropped |= partitions

    processor = object.__new__(BatchProcessor)
    processor.stage = Stage()  # type: ignore[assignment]
    processor.state = type("State", (), {})()
    processor.state.decided = {TopicPartition("raw", p): 10 * p for p in range(4)}
    processor.revoked({1, 3})
    assert processor.stage.dropped == {1, 3}  # type: ignore[attr-defined]
    assert set(processor.state.decided) == {TopicPartition("raw", 0), TopicPartition("raw", 2)}


def test_a_commit_of_a_transaction_the_worker_does_not_hold_fails(exits: list[int]) -> None:
    """Faust would count it committed, and the local store would take values never committed."""
    ok = FakeTransactional()
    producer = producer_with(a=ok)
    with pytest.raises(RuntimeError, match="does not hold"):
        asyncio.run(producer.commit_transactions({"a": {}, "gone": {}}, "group"))
    assert ok.committed and exits == []
