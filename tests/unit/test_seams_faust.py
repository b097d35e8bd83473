"""app/seams/faust/ against the pinned faust-streaming: each private member it relies on is there
with the expected signature, each method it replaces or wraps is the source it was written
against, and the transport builds the seam's classes."""

from __future__ import annotations

import asyncio
import inspect
from contextvars import ContextVar
from pathlib import Path

import faust
import pytest
from faust import streams
from faust.stores import rocksdb
from faust.tables import manager, recovery
from faust.transport import conductor
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka

from app.seams import faust as seam
from app.seams.faust import consumer as seam_consumer
from tests.unit.seams_upstream import assigns, changed, fingerprint, parameters

Consumer, TransactionManager = faust_consumer.Consumer, faust_consumer.TransactionManager
Producer, Thread = faust_aiokafka.Producer, faust_aiokafka.AIOKafkaConsumerThread

# Each method the seam overrides (its behaviour replayed or extended there), at the source it was read.
SOURCES = {
    "Consumer._drain_messages": (Consumer._drain_messages, "44a2500309e83c63"),
    "Consumer._wait_next_records": (Consumer._wait_next_records, "6218e1969a636b3f"),
    "Consumer.resume_flow": (Consumer.resume_flow, "db59630f25b5819b"),
    "Consumer._commit_handler": (Consumer._commit_handler.fun, "4e5da5df073082d6"),
    "Consumer._new_offset": (Consumer._new_offset, "1d2c7ea89a7ad4f1"),
    "Consumer._commit_offsets": (Consumer._commit_offsets, "1a69799041188441"),
    "TransactionManager.on_rebalance": (TransactionManager.on_rebalance, "2c190b35003af25c"),
    "TransactionManager.commit": (TransactionManager.commit, "fbb29c3467ac8bfa"),
    "TransactionManager._start_transactions": (TransactionManager._start_transactions, "6ee1a2d9b4196b3a"),
    "AIOKafkaConsumerThread._create_worker_consumer": (Thread._create_worker_consumer, "c2701bfc3e6f6cad"),
    "Producer._settings_extra": (Producer._settings_extra, "a4c7bc41b6382223"),
    "Producer.commit_transactions": (Producer.commit_transactions, "70091e6f431974e9"),
    "Producer.stop_transaction": (Producer.stop_transaction, "ba24cb80581302aa"),
    "Recovery._build_highwaters": (recovery.Recovery._build_highwaters, "91b4cc0d3724ae7b"),
    "TableManager.on_start": (manager.TableManager.on_start, "365dd25fbc0e0684"),
    "TableManager.recovery": (vars(manager.TableManager)["recovery"].fget, "f0bf5de78b4c3d23"),
}


def test_each_method_the_seam_overrides_is_the_source_it_was_written_against() -> None:
    expected = {name: digest for name, (_, digest) in SOURCES.items()}
    found = {name: fingerprint(obj) for name, (obj, _) in SOURCES.items()}
    assert found == expected, changed(expected, found, "faust-streaming")


@pytest.mark.parametrize(("owner", "method", "wanted"), [
    (Consumer, "_drain_messages", ["self", "fetcher"]),
    (Consumer, "_wait_next_records", ["self", "timeout"]),
    (Consumer, "_get_active_partitions", ["self"]),
    (Consumer, "resume_flow", ["self"]),
    (Consumer, "perform_seek", ["self"]),
    (Consumer, "_new_offset", ["self", "tp"]),
    (Consumer, "_commit_offsets", ["self", "offsets", "start_new_transaction"]),
    (Consumer, "_should_commit", ["self", "tp", "offset"]),
    (Consumer, "_add_gap", ["self", "tp", "offset_from", "offset_to"]),
    (Consumer, "maybe_wait_for_commit_to_finish", ["self"]),
    (Consumer, "wait_first", ["self", "coros", "timeout"]),
    (faust_aiokafka.Consumer, "_new_consumer_thread", ["self"]),
    (Thread, "_create_worker_consumer", ["self", "transport"]),
    (Thread, "_ensure_consumer", ["self"]),
    (Producer, "_settings_extra", ["self"]),
    (Producer, "stop_transaction", ["self", "transactional_id"]),
    (Producer, "maybe_begin_transaction", ["self", "transactional_id"]),
    (Producer, "commit_transactions", ["self", "tid_to_offset_map", "group_id", "start_new_transaction"]),
    (TransactionManager, "on_rebalance", ["self", "assigned", "revoked", "newly_assigned"]),
    (TransactionManager, "_start_transactions", ["self", "tids"]),
    (TransactionManager, "_tps_to_transactional_ids", ["self", "tps"]),
    (TransactionManager, "commit", ["self", "offsets", "start_new_transaction"]),
    (recovery.Recovery, "_build_highwaters", ["self", "consumer", "tps", "destination", "title"]),
    (manager.TableManager, "_update_channels", ["self"]),
    (rocksdb.Store, "_db_for_partition", ["self", "partition"]),
    (rocksdb.Store, "set_persisted_offset", ["self", "tp", "offset"]),
])
def test_each_private_method_relied_on_has_its_signature(owner: type, method: str, wanted: list[str]) -> None:
    assert parameters(getattr(owner, method)) == wanted, f"{owner.__name__}.{method} changed"


@pytest.mark.parametrize(("owner", "method", "attribute"), [
    (Consumer, "__init__", "_acked"),
    (Consumer, "__init__", "_acked_index"),
    (Consumer, "__init__", "_read_offset"),
    (Consumer, "__init__", "_committed_offset"),
    (Consumer, "__init__", "_commit_every"),
    (Consumer, "_reset_state", "_active_partitions"),
    (Consumer, "_reset_state", "_paused_partitions"),
    (faust_consumer.ThreadDelegateConsumer, "__init__", "_thread"),
    (Thread, "on_start", "_consumer"),
    (conductor.Conductor, "__init__", "_tp_index"),
    (conductor.Conductor, "__init__", "_tp_to_callback_lock"),
    (rocksdb.Store, "__init__", "use_rocksdict"),
    (recovery.Recovery, "__init__", "active_offsets"),
    (recovery.Recovery, "__init__", "standby_offsets"),
    (recovery.Recovery, "__init__", "active_highwaters"),
    # app/seams/faust/handover.py: the bookkeeping of a record taken and acked
    (Consumer, "__init__", "_unacked_messages"),
    (Consumer, "__init__", "_waiting_for_ack"),
])
def test_each_private_attribute_relied_on_is_still_set_where_it_was(owner: type, method: str, attribute: str) -> None:
    assert assigns(owner, method, attribute), f"{owner.__name__}.{method} no longer sets {attribute}"


def test_the_class_level_state_and_names_relied_on_are_there() -> None:
    assert isinstance(Producer._transaction_producers, dict) and isinstance(Producer._trn_locks, dict)
    assert rocksdb.Store.offset_key == b"__faust\0offset__"
    assert Consumer._n_acked == 0 and manager.TableManager._recovery is None  # class-level defaults
    assert isinstance(streams._current_event, ContextVar)
    # the handover drops and tracks records as Faust's stream iterator does (faust/_cython/streams.pyx)
    stream_iterator = (Path(streams.__file__).parent / "_cython" / "streams.pyx").read_text()
    assert "message.generation_id != self.app.consumer_generation_id" in stream_iterator
    assert "message.tracked = True\n                self.add_unacked(message)" in stream_iterator
    assert "acked_for_tp = self._acked[tp]" in inspect.getsource(Consumer.ack)
    assert "self._unacked_messages" in inspect.getsource(Consumer.wait_empty)
    assert faust_consumer.CONSUMER_FETCHING == "FETCHING"
    assert "flow_control" in vars(faust.App)  # a cached property the seam's app replaces
    # the drain loop the seam replays reads these the same way
    drain = inspect.getsource(Consumer._drain_messages)
    assert "getmany(timeout=1.0)" in drain and "callback(message), self.suspend_flow.wait()" in drain
    # the 1 s sleep with every partition paused, which the seam's _wait_next_records ends at a resume
    assert "await self.sleep(1)" in inspect.getsource(Consumer._wait_next_records)


def test_the_transport_builds_the_seams_consumer_producer_and_transaction_manager() -> None:
    assert issubclass(seam.Transport, faust_aiokafka.Transport)
    assert (seam.Transport.Consumer, seam.Transport.Producer, seam.Transport.TransactionManager) == (
        seam.Consumer, seam.Producer, seam.TransactionManager)
    app = seam.WorkerApp("seam-test", broker="kafka://127.0.0.1:1", store="memory://")
    app.transport = seam.Transport(app.conf.broker_consumer, app)
    assert isinstance(app.consumer, seam.Consumer)
    assert isinstance(app.producer, seam.Producer)
    assert seam.hooks_of(app) is None and seam.worker_transactional_id(app) is None


def paused_wait(monkeypatch: pytest.MonkeyPatch, wake: str) -> tuple[bool, bool, tuple[object, object]]:
    """The fetch loop's wait with every partition paused, then the partition resumed and ``wake``
    done ("flow": the flow resumed; "seek": the seek to the committed offsets): whether the wait
    was still on before the resume, whether it was still on after the resume alone, and what it
    returned. Faust's 1 s sleep and the seam's fallback are made endless, so only a wake-up ends it."""
    monkeypatch.setattr(seam_consumer, "PAUSED_WAIT_S", 3600.0)
    tp = faust.types.TP("seam-wake-raw", 0)

    async def scenario() -> tuple[bool, bool, tuple[object, object]]:
        app = seam.WorkerApp("seam-wake", broker="kafka://127.0.0.1:1", store="memory://")  # on this loop
        app.transport = seam.Transport(app.conf.broker_consumer, app)
        consumer = seam_consumer.consumer_of(app)

        async def sleeps_for_ever(seconds: float) -> None:  # Faust's 1 s sleep, made endless
            await asyncio.get_running_loop().create_future()

        async def seeks(self: object) -> None:  # Faust's seek (on the consumer thread), done at once
            return None

        monkeypatch.setattr(consumer, "sleep", sleeps_for_ever)
        monkeypatch.setattr(faust_aiokafka.Consumer, "perform_seek", seeks)
        monkeypatch.setattr(consumer, "assignment", set)  # nothing the seam would seek to the start
        consumer.resume_flow()
        consumer.pause_partitions({tp})
        waiting = asyncio.ensure_future(consumer._wait_next_records(1.0))
        for _ in range(20):
            await asyncio.sleep(0)
        before = not waiting.done()
        consumer.resume_partitions({tp})
        for _ in range(20):
            await asyncio.sleep(0)
        after_resume = not waiting.done()
        if wake == "flow":
            consumer.resume_flow()
        else:
            await consumer.perform_seek()
        return before, after_resume, await asyncio.wait_for(waiting, 30)

    return asyncio.run(scenario())


@pytest.mark.parametrize("wake", ["flow", "seek"])
def test_with_every_partition_paused_the_fetch_loop_wakes_once_the_resumed_ones_can_be_read(
        monkeypatch: pytest.MonkeyPatch, wake: str) -> None:
    """Faust slept 1 s there, so the partitions resumed at a recovery's end waited for it. The seam's
    wait ends after the seek that follows a resume (a fetch before it would hand records over
    twice) or when the flow resumes; the resume alone does not end it."""
    before, after_resume, answer = paused_wait(monkeypatch, wake)
    assert before and after_resume and answer == ({}, set())
