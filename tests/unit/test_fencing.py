"""KIP-447 fencing's requests and its refusal (app/seams/aiokafka.py), and the worker's one
transactional id (app/seams/faust/producer.py). On the broker: tests/integration/test_kafka_fencing.py."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.producer.transaction_manager import TransactionManager, TransactionResult, TransactionState
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st

from app.seams import aiokafka as fencing
from app.seams.faust import producer as transactions

names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=40)
int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
offsets = st.lists(st.tuples(names, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 2**62),
                                                            st.text(max_size=20)), min_size=1, max_size=5)),
                   min_size=1, max_size=4)


@given(names, names, st.integers(0, 2**62), st.integers(0, 2**15 - 1), int32, names,
       st.none() | names, offsets)
def test_a_transactional_offset_commit_carries_the_membership_and_every_offset(
        transactional_id: str, group_id: str, producer_id: int, epoch: int, generation: int, member_id: str,
        instance_id: str | None, topics: list[tuple[str, list[tuple[int, int, str]]]]) -> None:
    membership = fencing.Membership(generation, member_id, instance_id)
    request = fencing.FencedTxnOffsetCommitRequest(transactional_id, group_id, producer_id, epoch, membership, topics)
    struct = request.build(fencing.TxnOffsetCommitRequest_v3)
    decoded = fencing.TxnOffsetCommitRequest_v3.SCHEMA.decode(io.BytesIO(struct.encode()))
    assert decoded[:7] == (transactional_id, group_id, producer_id, epoch, generation, member_id, instance_id)
    assert [(topic, [(p, offset, metadata) for p, offset, _epoch, metadata, _tags in partitions])
            for topic, partitions, _tags in decoded[7]] == topics
    assert all(epoch == -1 for _topic, partitions, _tags in decoded[7] for _p, _o, epoch, _m, _t in partitions)


@given(names, st.lists(st.tuples(names, st.lists(st.integers(0, 10_000), min_size=1, max_size=5)),
                       min_size=1, max_size=4))
def test_an_offset_fetch_asks_for_stable_offsets(group_id: str, partitions: list[tuple[str, list[int]]]) -> None:
    struct = fencing.StableOffsetFetchRequest(group_id, partitions).build(fencing.OffsetFetchRequest_v7)
    decoded = fencing.OffsetFetchRequest_v7.SCHEMA.decode(io.BytesIO(struct.encode()))
    assert decoded[0] == group_id
    assert [(topic, indexes) for topic, indexes, _tags in decoded[1]] == partitions
    assert decoded[2] is True  # require_stable


async def test_a_refused_commit_leaves_a_transaction_that_the_abort_ends_at_the_broker() -> None:
    manager = TransactionManager("worker-1", 15_000)
    manager.set_pid_and_epoch(7, 0)
    manager.begin_transaction()
    written = TopicPartition("decisions", 3)
    manager.maybe_add_partition_to_txn(written)
    manager.partition_added(written)
    refused = manager.add_offsets_to_txn({TopicPartition("raw", 3): OffsetAndMetadata(10, "")}, "group")
    manager.consumer_group_added("group")
    error = fencing.FencedMemberError("refused")
    fencing._refuse(manager, error)
    assert manager.state == TransactionState.ABORTABLE_ERROR
    with pytest.raises(fencing.FencedMemberError):
        await refused
    with pytest.raises(fencing.FencedMemberError):
        manager.committing_transaction()  # a commit is refused: it can only be aborted
    manager.aborting_transaction()
    # aiokafka's error_transaction forgets the partitions, and its abort then never reaches the broker
    assert not manager.is_empty_transaction()
    assert manager.needs_transaction_commit() == TransactionResult.ABORT


def fake_app(transactional_id: str | None) -> Any:
    return SimpleNamespace(transactional_id=transactional_id, conf=SimpleNamespace(id="orderly-worker"),
                           assignor=SimpleNamespace(group_for_topic=lambda topic: 0))


@given(st.sets(st.integers(0, 63), max_size=12))
def test_a_worker_with_its_own_transactional_id_writes_every_partition_under_it(partitions: set[int]) -> None:
    app = fake_app("orderly-worker-worker-1")
    manager = transactions.TransactionManager.__new__(transactions.TransactionManager)
    manager.app = app
    tps = {TP("raw", p) for p in partitions}
    assert manager._tps_to_transactional_ids(tps) == ({"orderly-worker-worker-1"} if partitions else set())
    assert {transactions.transactional_id(app, "changelog", p) for p in partitions} <= {"orderly-worker-worker-1"}


@given(st.sets(st.integers(0, 63), min_size=1, max_size=12))
def test_without_one_each_partition_keeps_its_own_transactional_id(partitions: set[int]) -> None:
    app = fake_app(None)
    ids = {transactions.transactional_id(app, "changelog", p) for p in partitions}
    assert ids == {f"orderly-worker-0-{p}" for p in partitions}


def test_a_commit_carries_the_membership_its_offsets_were_taken_in() -> None:
    taken = fencing.Membership(4, "member-a", "worker-1")
    fencing.register("group-p")
    with fencing.pinned("group-p", taken):
        assert fencing._pinned["group-p"] == taken
    assert "group-p" not in fencing._pinned


@pytest.mark.parametrize("unknown", [fencing.Membership(-1, "", None), fencing.Membership(3, "", "worker-1")])
def test_a_commit_without_a_known_membership_is_refused(unknown: fencing.Membership) -> None:
    with pytest.raises(fencing.FencedMemberError), fencing.pinned("group-q", unknown):
        pass  # never reached
    assert "group-q" not in fencing._pinned


@pytest.mark.parametrize("in_transaction", [True, False])
def test_transactional_producers_time_out_after_the_settings_transaction_timeout(in_transaction: bool) -> None:
    from app.settings import TRANSACTION_TIMEOUT_S

    producer = object.__new__(transactions.Producer)
    producer.app = SimpleNamespace(in_transaction=in_transaction)  # type: ignore[assignment]
    extra = producer._settings_extra()
    assert extra.get("transaction_timeout_ms") == (TRANSACTION_TIMEOUT_S * 1000 if in_transaction else None)
    assert ("acks" in extra) is in_transaction  # Faust's own extras kept


@given(int32, st.lists(st.tuples(names, st.lists(st.tuples(st.integers(0, 10_000), st.integers(-1, 2**62), int32,
                                                           st.text(max_size=20), st.integers(0, 120)),
                                                 max_size=5)), max_size=4), st.integers(0, 120))
def test_the_responses_decode_what_their_schemas_encode(throttle: int, topics: list[Any], error: int) -> None:
    """The two flexible responses' nested topics and partitions (each level with its tagged fields)."""
    commit: list[Any] = [(topic, [(p, code, {}) for p, _o, _e, _m, code in partitions], {})
                         for topic, partitions in topics]
    encoded = fencing.TxnOffsetCommitResponse_v3.SCHEMA.encode((throttle, commit, {}))
    assert fencing.TxnOffsetCommitResponse_v3.SCHEMA.decode(io.BytesIO(encoded)) == (throttle, commit, {})
    fetch: list[Any] = [(topic, [(p, offset, epoch, metadata, code, {})
                                 for p, offset, epoch, metadata, code in partitions], {})
             for topic, partitions in topics]
    encoded = fencing.OffsetFetchResponse_v7.SCHEMA.encode((throttle, fetch, error, {}))
    assert fencing.OffsetFetchResponse_v7.SCHEMA.decode(io.BytesIO(encoded)) == (throttle, fetch, error, {})
