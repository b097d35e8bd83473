"""The door to aiokafka 0.14.0's internals: KIP-447 fencing of exactly-once commits, and the
private state of its consumers and producers the worker reads or tunes (seam layer).

aiokafka 0.14 commits a transaction's offsets with TxnOffsetCommit version 0, which carries no
consumer group generation, and reads committed offsets with OffsetFetch versions 1-3, which may
answer while a transaction's offsets are still pending. Then only a transactional id per source
partition fences a worker that lost a partition but still commits (the new owner's producer,
under the same id, ends the old one's). With these two requests one producer per worker is safe
(and both models, in one group, fence each other):

- TxnOffsetCommit version 3 carries the group generation, member id and group instance id of the
  worker's consumer, pinned when the offsets are taken (``pinned``); the group coordinator refuses the offsets of
  a member of an earlier generation (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID),
  and the transaction can then only be aborted.
- OffsetFetch version 7 asks with ``require_stable``: while a transaction holding offsets of a
  partition is open, the coordinator answers UNSTABLE_OFFSET_COMMIT, and the fetch is tried again
  after the retry backoff until the transaction has ended (committed or aborted).

Both are patches of aiokafka's modules, installed by ``install`` (the worker's start-up calls it,
nothing does at import; a second call changes nothing). Paths and line numbers below are of
aiokafka 0.14.0 (app/seams/__init__.py pins it; tests/unit/test_seams_aiokafka.py checks them).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import errors as Errors
from aiokafka.consumer import group_coordinator
from aiokafka.producer import sender
from aiokafka.producer.transaction_manager import TransactionState
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Boolean, CompactArray, CompactString, Int16, Int32, Int64, Schema, TaggedFields
from aiokafka.structs import OffsetAndMetadata, TopicPartition

log = logging.getLogger("orderly.worker")

ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID = 22, 25, 82
UNSTABLE_OFFSET_COMMIT = 88
NO_GENERATION = -1  # KIP-447: with no generation and no member id the coordinator checks neither


class Membership(NamedTuple):
    """What a consumer group member is in its current generation."""

    generation: int
    member_id: str
    group_instance_id: str | None


# the groups whose transactional offset commits must carry a pinned membership (the worker's)
_guarded: set[str] = set()
# group id -> the membership a commit under way took its offsets in (pinned)
_pinned: dict[str, Membership] = {}


def register(group_id: str) -> None:
    """From now on a transactional offset commit to ``group_id`` is sent only inside ``pinned``."""
    _guarded.add(group_id)


@contextmanager
def pinned(group_id: str, membership: Membership) -> Iterator[None]:
    """While inside, the transactional offset commits to ``group_id`` carry ``membership``: the one
    the offsets were taken in, not the one current when aiokafka builds (or rebuilds, to retry) the
    request. Else a commit under way across a rebalance would carry the next generation, which the
    coordinator accepts though its partitions may now be another member's. A membership not known
    (no generation yet) is refused here: a commit without one is never checked."""
    if membership.generation < 0 or not membership.member_id:
        raise FencedMemberError(f"no membership of {group_id} to commit in ({membership})")
    _pinned[group_id] = membership
    try:
        yield
    finally:
        _pinned.pop(group_id, None)


class UnstableOffsetCommitError(Errors.KafkaError):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    """A transaction holding offsets of the partition is still open (retried after a backoff)."""

    errno = UNSTABLE_OFFSET_COMMIT
    retriable = True


class FencedMemberError(Errors.KafkaError):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    """The group coordinator refused a transaction's offsets: this worker is no longer the member
    of the group's current generation that it was (its partitions may be another's by now)."""


def _per_topic(*partition_fields: tuple[str, Any]) -> CompactArray:
    """A flexible version's array of topics, each with its name and its array of partitions (these
    fields), each level ending in its tagged fields."""
    return CompactArray(("name", CompactString("utf-8")),
                        ("partitions", CompactArray(*partition_fields, ("tags", TaggedFields))),
                        ("tags", TaggedFields))


class TxnOffsetCommitResponse_v3(Response):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    API_KEY = 28
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("topics", _per_topic(("partition_index", Int32), ("error_code", Int16))),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest_v3(RequestStruct):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    FLEXIBLE_VERSION = True
    API_KEY = 28
    API_VERSION = 3
    RESPONSE_TYPE = TxnOffsetCommitResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        ("topics", _per_topic(("partition_index", Int32), ("committed_offset", Int64),
                              ("committed_leader_epoch", Int32), ("committed_metadata", CompactString("utf-8")))),
        ("tags", TaggedFields),
    )


class FencedTxnOffsetCommitRequest(Request[TxnOffsetCommitRequest_v3]):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    API_KEY = 28

    def __init__(self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int,
                 membership: Membership, topics: list[tuple[str, list[tuple[int, int, str]]]]) -> None:
        self._fields: tuple[Any, ...] = (transactional_id, group_id, producer_id, producer_epoch, membership.generation,
                        membership.member_id, membership.group_instance_id,
                        [(topic, [(partition, offset, -1, metadata, {})  # -1: no leader epoch
                                  for partition, offset, metadata in partitions], {})
                         for topic, partitions in topics], {})

    def build(self, request_struct_class: type[TxnOffsetCommitRequest_v3]) -> TxnOffsetCommitRequest_v3:
        return request_struct_class(*self._fields)


class OffsetFetchResponse_v7(Response):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    API_KEY = 9
    API_VERSION = 7
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("topics", _per_topic(("partition_index", Int32), ("committed_offset", Int64),
                              ("committed_leader_epoch", Int32), ("metadata", CompactString("utf-8")),
                              ("error_code", Int16))),
        ("error_code", Int16),
        ("tags", TaggedFields),
    )


class OffsetFetchRequest_v7(RequestStruct):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    FLEXIBLE_VERSION = True
    API_KEY = 9
    API_VERSION = 7
    RESPONSE_TYPE = OffsetFetchResponse_v7
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        ("topics", CompactArray(("name", CompactString("utf-8")), ("partition_indexes", CompactArray(Int32)),
                                ("tags", TaggedFields))),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class StableOffsetFetchRequest(Request[OffsetFetchRequest_v7]):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    API_KEY = 9

    def __init__(self, group_id: str, partitions: list[tuple[str, list[int]]]) -> None:
        self._fields: tuple[Any, ...] = (group_id, [(topic, indexes, {}) for topic, indexes in partitions], True, {})

    def build(self, request_struct_class: type[OffsetFetchRequest_v7]) -> OffsetFetchRequest_v7:
        return request_struct_class(*self._fields)


class _TxnOffsetCommitHandler(sender.TxnOffsetCommitHandler):  # type: ignore[misc]  # aiokafka is untyped here
    """aiokafka's handler, with version 3 and the worker's membership; a refusal for being an
    earlier generation's member makes the transaction abortable only. Relied on (producer/sender.py
    TxnOffsetCommitHandler, line 617): its _offsets and _group_id, its sender's _txn_manager (the
    producer's TransactionManager: transactional_id, producer_id, producer_epoch), and
    handle_response reading ``resp.errors`` in version 0's shape."""

    def create_request(self) -> FencedTxnOffsetCommitRequest:
        txn_manager = self._sender._txn_manager
        offsets: dict[str, list[tuple[int, int, str]]] = collections.defaultdict(list)
        for tp, offset in sorted(self._offsets.items()):
            offsets[tp.topic].append((tp.partition, offset.offset, offset.metadata))
        membership = _pinned.get(self._group_id)
        if membership is None:
            if self._group_id in _guarded:  # the worker's group: only ever the membership its offsets were taken in
                raise FencedMemberError(f"offsets of {self._group_id} sent outside a commit's pinned membership")
            membership = Membership(NO_GENERATION, "", None)
        return FencedTxnOffsetCommitRequest(txn_manager.transactional_id, self._group_id, txn_manager.producer_id,
                                            txn_manager.producer_epoch, membership, list(offsets.items()))

    def handle_response(self, resp: Any) -> float | None:
        fenced = [(topic, partition, code) for topic, partitions, _tags in resp.topics
                  for partition, code, _ptags in partitions
                  if code in (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID)]
        if fenced:
            topic, partition, code = fenced[0]
            log.warning("the group coordinator refused this transaction's offsets (error %d for %s[%d]): this "
                        "worker is no longer the member it was", code, topic, partition)
            _refuse(self._sender._txn_manager, FencedMemberError(
                f"the offsets of {topic}[{partition}] were refused (Kafka error {code}): this worker is no "
                "longer a member of its group's current generation"))
            return None
        # aiokafka's handling of every other answer reads version 0's shape
        resp.errors = [(topic, [(partition, code) for partition, code, _tags in partitions])
                       for topic, partitions, _tags in resp.topics]
        return super().handle_response(resp)  # type: ignore[no-any-return]


def _refuse(txn_manager: Any, exc: Exception) -> None:
    """aiokafka's error_transaction, but the transaction's partitions kept: aiokafka's abort ends
    at the broker only a transaction it knows to hold something (else the broker keeps it open,
    and read_committed readers wait at its first record, until the transaction timeout).
    producer/transaction_manager.py TransactionManager: _transition_to (line 106), and the state
    error_transaction (line 141) resets: _pending_txn_partitions, _pending_txn_offsets (a deque of
    (group id, offsets, future)), _transaction_waiter (lines 60-66)."""
    txn_manager._transition_to(TransactionState.ABORTABLE_ERROR)
    txn_manager._pending_txn_partitions.clear()  # never added: nothing of them at the broker
    for _group_id, _offsets, refused in txn_manager._pending_txn_offsets:
        refused.set_exception(exc)
    txn_manager._pending_txn_offsets.clear()
    waiter = txn_manager._transaction_waiter
    waiter.set_exception(exc)
    waiter.exception()  # commit_transaction raises it; nothing else need retrieve it


async def _fetch_stable_offsets(self: Any, partitions: list[TopicPartition]) -> dict[TopicPartition, OffsetAndMetadata]:
    """aiokafka's GroupCoordinator._do_fetch_commit_offsets (consumer/group_coordinator.py line
    1184), asking for stable offsets (version 7): it sends through the coordinator's _send_req
    (line 299), and its caller, fetch_committed_offsets, retries a retriable error after the backoff."""
    by_topic: dict[str, list[int]] = collections.defaultdict(list)
    for tp in partitions:
        by_topic[tp.topic].append(tp.partition)
    response = await self._send_req(StableOffsetFetchRequest(self.group_id, list(by_topic.items())))
    if response.error_code:
        _raise_fetch_error(self, Errors.for_code(response.error_code), None)
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    for topic, topic_partitions, _tags in response.topics:
        for partition, offset, _epoch, metadata, error_code, _ptags in topic_partitions:
            tp = TopicPartition(topic, partition)
            if error_code == UNSTABLE_OFFSET_COMMIT:
                log.info("the committed offset of %s waits for an open transaction to end", tp)
                raise UnstableOffsetCommitError(f"a transaction holding offsets of {tp} is still open")
            if error_code:
                error_type = Errors.for_code(error_code)
                if error_type is Errors.UnknownTopicOrPartitionError:
                    continue
                _raise_fetch_error(self, error_type, tp)
            if offset != -1:
                offsets[tp] = OffsetAndMetadata(offset, metadata or "")
    return offsets


def _raise_fetch_error(coordinator: Any, error_type: type[Errors.KafkaError], tp: TopicPartition | None) -> None:
    """What aiokafka's own _do_fetch_commit_offsets does with each error code (coordinator_dead: line 516)."""
    if error_type in (Errors.NotCoordinatorForGroupError, Errors.GroupCoordinatorNotAvailableError):
        coordinator.coordinator_dead()  # found again before the retry
    if error_type in (Errors.GroupLoadInProgressError, Errors.NotCoordinatorForGroupError,
                      Errors.GroupCoordinatorNotAvailableError):
        raise error_type()  # retried after the backoff (a broker starting or stopping)
    if error_type is Errors.GroupAuthorizationFailedError:
        raise error_type(coordinator.group_id)
    raise Errors.KafkaError(f"fetching the committed offsets{f' of {tp}' if tp else ''}: {error_type.__name__}")


# The originals the patches replace, kept for the seam's tests (the signature and source they were read at).
ORIGINAL_TXN_OFFSET_COMMIT_HANDLER = sender.TxnOffsetCommitHandler
ORIGINAL_FETCH_COMMIT_OFFSETS = group_coordinator.GroupCoordinator._do_fetch_commit_offsets


def install() -> None:
    """Every aiokafka producer and consumer of this process from then on: TxnOffsetCommit version 3
    with the registered membership, OffsetFetch version 7 with require_stable. Idempotent."""
    # producer/sender.py Sender._do_txn_offset_commit (line 340) builds its handler (line 356) by this
    # module-global name at each commit, so replacing the name replaces the handler
    sender.TxnOffsetCommitHandler = _TxnOffsetCommitHandler
    # consumer/group_coordinator.py GroupCoordinator.fetch_committed_offsets (its retry loop) awaits
    # self._do_fetch_commit_offsets(partitions) (line 1184), retrying on retriable errors after the backoff
    group_coordinator.GroupCoordinator._do_fetch_commit_offsets = _fetch_stable_offsets


def installed() -> bool:
    return (sender.TxnOffsetCommitHandler is _TxnOffsetCommitHandler
            and group_coordinator.GroupCoordinator._do_fetch_commit_offsets is _fetch_stable_offsets)


# --- the private state of aiokafka's clients that the worker reads or tunes ---

def group_membership(consumer: AIOKafkaConsumer | None) -> Membership:
    """The membership that ``consumer``'s group coordinator holds now (none before it runs).
    consumer/consumer.py AIOKafkaConsumer._coordinator (set in start(), line 403);
    consumer/group_coordinator.py GroupCoordinator.generation, .member_id (public attributes) and
    ._group_instance_id (line 264)."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None:
        return Membership(NO_GENERATION, "", None)
    return Membership(coordinator.generation, coordinator.member_id, coordinator._group_instance_id)


def member_id(consumer: AIOKafkaConsumer | None) -> str | None:
    """The id the group coordinator gave ``consumer`` when it last joined (None before)."""
    found: str | None = getattr(getattr(consumer, "_coordinator", None), "member_id", None)
    return found or None


def coordination_failure(consumer: AIOKafkaConsumer | None) -> BaseException | None:
    """Why ``consumer``'s group coordination ended, or None while it runs: GroupCoordinator's
    _coordination_task (consumer/group_coordinator.py line 272) runs for as long as it is a member."""
    task = getattr(getattr(consumer, "_coordinator", None), "_coordination_task", None)
    if task is None or not task.done() or task.cancelled():
        return None
    failure: BaseException | None = task.exception()
    return failure


def request_rejoin(consumer: AIOKafkaConsumer | None, generation: int) -> None:
    """Has ``consumer`` join its group again at once, as a heartbeat answered REBALANCE_IN_PROGRESS
    would (consumer/group_coordinator.py GroupCoordinator.request_rejoin, line 538, which its heartbeat
    calls on that answer): after this process removed a lost member, instead of waiting out the heartbeat
    interval to hear of the rebalance; not if the group moved past ``generation`` meanwhile (that
    rebalance is over: another join would only start one more). From any thread: Faust runs aiokafka's
    consumer on a loop of its own, so the call is scheduled on the loop of the coordinator's
    _rejoin_needed_fut (line 269, made again on the same loop at line 1443), which its coordination task
    waits on. Before start, nothing."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None:
        return

    def rejoin() -> None:
        if coordinator.generation == generation:
            coordinator.request_rejoin()

    coordinator._rejoin_needed_fut.get_loop().call_soon_threadsafe(rejoin)


def positions(consumer: AIOKafkaConsumer, topic: str) -> dict[int, int | None]:
    """``consumer``'s fetch position of each assigned partition of ``topic`` (a stall's diagnosis):
    AIOKafkaConsumer._subscription (consumer.py line 341), SubscriptionState.subscription.assignment
    .state_value(tp).position (consumer/subscription_state.py line 415)."""
    return {tp.partition: consumer._subscription.subscription.assignment.state_value(tp).position
            for tp in consumer.assignment() if tp.topic == topic}


def set_fetch_max_wait(consumer: AIOKafkaConsumer, wait_ms: int) -> None:
    """Before ``consumer`` starts: AIOKafkaConsumer.__init__ keeps fetch_max_wait_ms as
    _fetch_max_wait_ms (consumer.py line 330), which start() hands to its Fetcher (line 391)."""
    consumer._fetch_max_wait_ms = wait_ms


def set_fetch_pace(consumer: AIOKafkaConsumer | None, min_bytes: int, max_wait_ms: int) -> None:
    """From ``consumer``'s next fetch request on (a started consumer; else nothing): how much the
    broker waits for, and how long at most. Fetcher reads _fetch_min_bytes and _fetch_max_wait_ms
    (consumer/fetcher.py lines 405, 407) for each request it builds (Fetcher._get_actions_per_node,
    lines 663-664). AIOKafkaConsumer._fetcher: consumer.py line 384."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is not None:
        fetcher._fetch_min_bytes = min_bytes
        fetcher._fetch_max_wait_ms = max_wait_ms


def set_fetch_min_bytes(consumer: AIOKafkaConsumer | None, value: int) -> None:
    """From ``consumer``'s next fetch request on (a started consumer; else nothing): Fetcher reads its
    _fetch_min_bytes (consumer/fetcher.py line 405) for each request it builds
    (Fetcher._get_actions_per_node, line 664), a plain
    attribute, so setting it from another thread is safe. AIOKafkaConsumer._fetcher: consumer.py line 384."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is not None:
        fetcher._fetch_min_bytes = value


def in_transaction(producer: AIOKafkaProducer | None) -> bool:
    """Whether ``producer`` (transactional) has a transaction open: AIOKafkaProducer._txn_manager
    (producer/producer.py line 272), TransactionManager.is_in_transaction (transaction_manager.py line 180)."""
    return producer is not None and bool(producer._txn_manager.is_in_transaction())
