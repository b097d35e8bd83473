"""app/seams/aiokafka.py against the pinned aiokafka: each private member it relies on is there
with the expected signature, the functions it patches or replays are the source it was written
against, and its patches are installed only when asked, once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.consumer import consumer as aiokafka_consumer
from aiokafka.consumer import fetcher, group_coordinator, subscription_state
from aiokafka.producer import producer as aiokafka_producer
from aiokafka.producer import sender, transaction_manager

from app.seams import aiokafka as seam
from tests.unit.seams_upstream import assigns, changed, fingerprint, parameters

ROOT = Path(__file__).resolve().parents[2]

# What the seam patches (by these originals) or replays (aiokafka's handling it builds on).
SOURCES = {
    "sender.TxnOffsetCommitHandler": (seam.ORIGINAL_TXN_OFFSET_COMMIT_HANDLER, "7f296a144356cb01"),
    "sender.Sender._do_txn_offset_commit": (sender.Sender._do_txn_offset_commit, "3841d6ec6c967302"),
    "GroupCoordinator._do_fetch_commit_offsets": (seam.ORIGINAL_FETCH_COMMIT_OFFSETS, "b0f3598132715552"),
    "GroupCoordinator.fetch_committed_offsets": (group_coordinator.GroupCoordinator.fetch_committed_offsets,
                                                 "6c049c7379165952"),
    "TransactionManager.error_transaction": (transaction_manager.TransactionManager.error_transaction,
                                             "5c72d40ab25eadfc"),
}


def test_the_source_the_seam_patches_and_replays_is_the_one_it_was_written_against() -> None:
    expected = {name: digest for name, (_, digest) in SOURCES.items()}
    found = {name: fingerprint(obj) for name, (obj, _) in SOURCES.items()}
    assert found == expected, changed(expected, found, "aiokafka")


@pytest.mark.parametrize(("owner", "method", "wanted"), [
    (sender.TxnOffsetCommitHandler, "__init__", ["self", "sender", "offsets", "group_id"]),
    (sender.TxnOffsetCommitHandler, "create_request", ["self"]),
    (sender.TxnOffsetCommitHandler, "handle_response", ["self", "resp"]),
    (group_coordinator.GroupCoordinator, "_do_fetch_commit_offsets", ["self", "partitions"]),
    (group_coordinator.GroupCoordinator, "_send_req", ["self", "request"]),
    (group_coordinator.GroupCoordinator, "coordinator_dead", ["self"]),
    (group_coordinator.GroupCoordinator, "request_rejoin", ["self"]),
    (transaction_manager.TransactionManager, "_transition_to", ["self", "target"]),
    (transaction_manager.TransactionManager, "is_in_transaction", ["self"]),
    (subscription_state.Assignment, "state_value", ["self", "tp"]),
])
def test_each_private_method_relied_on_has_its_signature(owner: type, method: str, wanted: list[str]) -> None:
    assert parameters(getattr(owner, method)) == wanted, f"{owner.__name__}.{method} changed"


@pytest.mark.parametrize(("owner", "method", "attribute"), [
    (aiokafka_consumer.AIOKafkaConsumer, "__init__", "_fetch_max_wait_ms"),
    (aiokafka_consumer.AIOKafkaConsumer, "__init__", "_subscription"),
    (aiokafka_consumer.AIOKafkaConsumer, "start", "_fetcher"),
    (aiokafka_consumer.AIOKafkaConsumer, "start", "_coordinator"),
    (fetcher.Fetcher, "__init__", "_fetch_min_bytes"),
    (fetcher.Fetcher, "__init__", "_fetch_max_wait_ms"),
    (group_coordinator.GroupCoordinator, "__init__", "_group_instance_id"),
    (group_coordinator.GroupCoordinator, "__init__", "_coordination_task"),
    (group_coordinator.GroupCoordinator, "__init__", "generation"),
    (group_coordinator.GroupCoordinator, "__init__", "member_id"),
    (group_coordinator.GroupCoordinator, "__init__", "_rejoin_needed_fut"),
    (aiokafka_producer.AIOKafkaProducer, "__init__", "_txn_manager"),
    (transaction_manager.TransactionManager, "__init__", "_pending_txn_partitions"),
    (transaction_manager.TransactionManager, "__init__", "_pending_txn_offsets"),
    (transaction_manager.TransactionManager, "__init__", "_transaction_waiter"),
    (sender.TxnOffsetCommitHandler, "__init__", "_offsets"),
    (sender.TxnOffsetCommitHandler, "__init__", "_group_id"),
])
def test_each_private_attribute_relied_on_is_still_set_where_it_was(owner: type, method: str, attribute: str) -> None:
    assert assigns(owner, method, attribute), f"{owner.__name__}.{method} no longer sets {attribute}"


def test_the_fetch_reads_its_minimum_from_the_attribute_the_seam_sets() -> None:
    import inspect

    assert "self._fetch_min_bytes" in inspect.getsource(fetcher.Fetcher._get_actions_per_node)
    assert "self._fetch_max_wait_ms" in inspect.getsource(fetcher.Fetcher._get_actions_per_node)
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in inspect.getsource(aiokafka_consumer.AIOKafkaConsumer.start)


def test_the_patches_are_installed_only_when_asked_and_once() -> None:
    """In a process of its own: importing the worker and the seams patches nothing; install() does,
    and a second call changes nothing."""
    script = """
import app.worker, app.seams.faust
from app.seams import aiokafka as seam
from aiokafka.producer import sender
from aiokafka.consumer import group_coordinator
assert not seam.installed()
assert sender.TxnOffsetCommitHandler is seam.ORIGINAL_TXN_OFFSET_COMMIT_HANDLER
assert group_coordinator.GroupCoordinator._do_fetch_commit_offsets is seam.ORIGINAL_FETCH_COMMIT_OFFSETS
seam.install()
first = (sender.TxnOffsetCommitHandler, group_coordinator.GroupCoordinator._do_fetch_commit_offsets)
seam.install()
assert seam.installed()
assert (sender.TxnOffsetCommitHandler, group_coordinator.GroupCoordinator._do_fetch_commit_offsets) == first
assert sender.TxnOffsetCommitHandler.__mro__[1] is seam.ORIGINAL_TXN_OFFSET_COMMIT_HANDLER
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


async def test_the_accessors_read_an_unstarted_consumer_and_producer() -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
    try:
        assert seam.group_membership(consumer) == seam.Membership(seam.NO_GENERATION, "", None)
        assert seam.group_membership(None).generation == seam.NO_GENERATION
        assert seam.member_id(consumer) is None and seam.coordination_failure(consumer) is None
        seam.set_fetch_max_wait(consumer, 100)
        assert consumer._fetch_max_wait_ms == 100
        seam.set_fetch_min_bytes(consumer, 4096)  # not started: no fetcher yet, nothing to set
        seam.set_fetch_pace(consumer, 1, 250)
        assert consumer._fetcher is None
        assert seam.positions(consumer, "t") == {}
    finally:
        await consumer.stop()
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", transactional_id="t-1")
    assert seam.in_transaction(producer) is False and seam.in_transaction(None) is False


async def test_a_rejoin_is_asked_on_the_coordinators_loop_and_not_once_the_group_moved_on() -> None:
    """From the peers' thread: scheduled on the loop the coordinator's future belongs to; skipped when
    the generation the removal was sent in is over."""
    loop = asyncio.get_running_loop()
    asked: list[tuple[int, bool]] = []

    class Coordinator:
        generation = 5
        _rejoin_needed_fut = loop.create_future()

        def request_rejoin(self) -> None:
            asked.append((self.generation, asyncio.get_running_loop() is loop))

    consumer = SimpleNamespace(_coordinator=Coordinator())
    await asyncio.to_thread(seam.request_rejoin, consumer, 5)
    await asyncio.sleep(0.05)
    assert asked == [(5, True)]
    consumer._coordinator.generation = 6
    await asyncio.to_thread(seam.request_rejoin, consumer, 5)
    await asyncio.sleep(0.05)
    assert asked == [(5, True)]
    seam.request_rejoin(None, 5)  # no consumer yet: nothing
