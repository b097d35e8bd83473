"""app/worker/peers.py's pure parts: which peers a worker removes from its group, from the records of
the workers topic in their order (Hypothesis), and which records it reads at all."""

from __future__ import annotations

import struct

import orjson
from hypothesis import given
from hypothesis import strategies as st

from app.seams.aiokafka_groups import LeaveGroupResponse_v3, RemoveMembersRequest
from app.worker.peers import FORGET_MS, MAX_PEERS, MAX_RECORD_BYTES, STEADY_MS, PeerView, parse

LOST_AFTER = 3000
EVERY = 250  # ms between a worker's records


def view() -> PeerView:
    return PeerView("me", LOST_AFTER)


def steady(v: PeerView, start: int, end: int) -> None:
    """This worker's own records from ``start`` to ``end``, every EVERY ms (and one at ``end``)."""
    for at in [*range(start, end, EVERY), end]:
        v.saw("me", "m-0", "me", at)


@given(st.lists(st.integers(min_value=1, max_value=LOST_AFTER), min_size=1, max_size=60),
       st.integers(min_value=1, max_value=STEADY_MS))
def test_a_peer_that_keeps_saying_it_is_alive_is_never_lost(gaps: list[int], own_every: int) -> None:
    """Its records no further apart than the setting, this worker's own at any steady pace: never lost."""
    v, peer_at = view(), 0
    v.saw("peer", "m-1", "peer", 0)
    own_at = 0
    for gap in gaps:
        next_peer = peer_at + gap
        while own_at + own_every < next_peer:  # this worker's records up to the peer's next one
            own_at += own_every
            v.saw("me", "m-0", "me", own_at)
            assert v.lost() == [], (own_at, peer_at)
        peer_at = next_peer
        v.saw("peer", "m-1", "peer", peer_at)
        assert v.lost() == []


@given(st.integers(min_value=0, max_value=10**12), st.integers(min_value=1, max_value=STEADY_MS))
def test_a_silent_peer_is_lost_once_past_the_setting(start: int, own_every: int) -> None:
    v = view()
    v.saw("me", "m-0", "me", start)
    v.saw("peer", "m-1", "peer", start)
    own_at, found = start, []
    while own_at - start <= LOST_AFTER + 2 * STEADY_MS:
        own_at += own_every
        v.saw("me", "m-0", "me", own_at)
        lost = v.lost()
        for key, peer in lost:
            v.removing(key, peer.member)
            found.append((own_at - start, key, peer.member))
    assert [(key, member) for _, key, member in found] == [("peer", "m-1")]  # once
    assert LOST_AFTER < found[0][0] <= LOST_AFTER + own_every  # at the first own record past the setting


@given(st.integers(min_value=STEADY_MS + 1, max_value=10 * LOST_AFTER))
def test_a_pause_of_its_own_records_counts_for_nobody(pause: int) -> None:
    """This worker's records stopped (its process starved, the partition's leader moving): the peers'
    silence starts again where its own records resume."""
    v = view()
    v.saw("me", "m-0", "me", 0)
    v.saw("peer", "m-1", "peer", 0)
    v.saw("me", "m-0", "me", pause)
    assert v.lost() == []
    steady(v, pause, pause + LOST_AFTER)
    assert v.lost() == []  # silent for the setting, not more, since the resumption
    steady(v, pause + LOST_AFTER, pause + LOST_AFTER + 1)
    assert [key for key, _ in v.lost()] == ["peer"]


def test_a_pause_of_its_own_records_moves_when_silence_counts_from_not_when_a_peer_was_heard() -> None:
    v = view()
    v.saw("me", "m-0", "me", 0)
    v.saw("peer", "m-1", "peer", 0)
    v.saw("me", "m-0", "me", 5000)
    assert (v.peers["peer"].at, v.peers["peer"].heard) == (5000, 0)
    v.saw("peer", "m-1", "peer", 5100)
    assert (v.peers["peer"].at, v.peers["peer"].heard) == (5100, 5100)


def test_nothing_is_lost_before_this_worker_reads_its_own_record() -> None:
    v = view()
    v.saw("peer", "m-1", "peer", 0)
    v.saw("other", "m-2", "other", 10 * LOST_AFTER)
    assert v.lost() == []


def test_a_peer_that_never_joined_is_never_removed() -> None:
    v = view()
    v.saw("peer", "", "peer", 0)
    v.saw("me", "m-0", "me", 2 * LOST_AFTER)
    assert v.lost() == []


def test_a_restarted_static_peer_is_judged_by_its_new_records() -> None:
    v = view()
    v.saw("peer", "m-1", "peer", 0)
    steady(v, 0, LOST_AFTER + 1)
    [(key, peer)] = v.lost()
    v.removing(key, peer.member)
    v.saw("peer", "", "peer", LOST_AFTER + 100)  # back under its id, not yet joined
    v.saw("peer", "m-2", "peer", LOST_AFTER + 900)  # joined as a new member
    steady(v, LOST_AFTER + 1, LOST_AFTER + 900 + LOST_AFTER)
    assert v.lost() == []
    steady(v, LOST_AFTER + 900 + LOST_AFTER, LOST_AFTER + 900 + LOST_AFTER + 1)
    assert [(k, p.member) for k, p in v.lost()] == [("peer", "m-2")]  # the new member, lost in turn


def test_an_older_record_read_late_does_not_move_a_peer_back() -> None:
    v = view()
    v.saw("peer", "m-1", "peer", 5000)
    v.saw("peer", "m-0", "peer", 1000)
    assert v.peers["peer"].at == 5000 and v.peers["peer"].member == "m-1"


def test_a_peer_silent_long_past_the_setting_is_forgotten() -> None:
    v = view()
    v.saw("peer", "m-1", "peer", 0)
    steady(v, 0, LOST_AFTER + 1)
    [(key, peer)] = v.lost()
    v.removing(key, peer.member)
    for at in range(LOST_AFTER + 1, FORGET_MS + 2 * EVERY, EVERY):
        v.saw("me", "m-0", "me", at)
        assert v.lost() == []
    assert v.peers == {} and v.tried == {}


def test_a_flood_of_keys_is_remembered_up_to_a_bound_and_the_known_ones_still_count() -> None:
    v = view()
    v.saw("peer", "m-1", "peer", 0)
    for i in range(3 * MAX_PEERS):
        v.saw(f"flood-{i}", f"m-flood-{i}", None, 0)
    assert len(v.peers) == MAX_PEERS and "peer" in v.peers
    v.saw("peer", "m-1", "peer", 100)
    assert v.peers["peer"].at == 100


def test_a_worker_that_said_it_stops_is_left_to_its_session() -> None:
    v = view()
    v.saw("peer", "m-1", "peer", 0, stopping=True)
    steady(v, 0, 3 * LOST_AFTER)
    assert v.lost() == []
    v.saw("peer", "", "peer", 3 * LOST_AFTER)  # started again under its id
    v.saw("peer", "m-2", "peer", 3 * LOST_AFTER + 500)
    steady(v, 3 * LOST_AFTER, 4 * LOST_AFTER + 501)
    assert [(k, p.member) for k, p in v.lost()] == [("peer", "m-2")]  # lost this time: no word of stopping


def test_a_record_under_another_key_than_its_instance_or_for_a_member_another_key_speaks_for_is_not_read() -> None:
    v = view()
    v.saw("forged", "m-1", "peer", 0)  # a static worker's records are keyed by its instance id
    v.saw("peer", "m-1", "peer", 0)
    v.saw("forged-2", "m-1", None, 100)  # m-1 is the peer's
    assert set(v.peers) == {"peer"}
    steady(v, 0, LOST_AFTER + 1)
    assert [k for k, _ in v.lost()] == ["peer"]


def test_a_failed_removal_is_tried_again_after_the_setting_not_at_every_look() -> None:
    v = view()
    v.saw("peer", "m-1", "peer", 0)
    steady(v, 0, LOST_AFTER + 1)
    [(key, _)] = v.lost()
    v.failed(key)
    steady(v, LOST_AFTER + 1, 2 * LOST_AFTER + 1)
    assert v.lost() == []
    steady(v, 2 * LOST_AFTER + 1, 2 * LOST_AFTER + 2)
    assert [k for k, _ in v.lost()] == ["peer"]


def test_a_long_setting_is_not_outlasted_by_forgetting() -> None:
    v = PeerView("me", 2 * FORGET_MS)
    v.saw("peer", "m-1", "peer", 0)
    steady(v, 0, 2 * FORGET_MS + 1)
    assert [k for k, _ in v.lost()] == ["peer"]


def record(**body: object) -> bytes:
    return orjson.dumps({"group": "g", "member": "m-1", "instance": "w-1", **body})


def test_only_a_record_of_the_group_with_its_fields_is_read() -> None:
    assert parse(record(), "g") == ("m-1", "w-1", False)
    assert parse(record(instance=None), "g") == ("m-1", None, False)
    assert parse(record(stopping=True), "g") == ("m-1", "w-1", True)
    assert parse(record(stopping="yes"), "g") is None
    assert parse(record(), "other") is None
    assert parse(record(member=7), "g") is None
    assert parse(record(instance=["w"]), "g") is None
    assert parse(b"[1, 2]", "g") is None
    assert parse(b"{not json", "g") is None
    assert parse(None, "g") is None
    assert parse(record(pad="x" * MAX_RECORD_BYTES), "g") is None


@given(st.binary(max_size=2 * MAX_RECORD_BYTES))
def test_no_bytes_on_the_topic_make_the_reader_raise(value: bytes) -> None:
    found = parse(value, "g")
    assert found is None or (isinstance(found[0], str) and (found[1] is None or isinstance(found[1], str))
                             and isinstance(found[2], bool))


def kafka_string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def test_the_removal_is_leave_group_version_3_as_kafka_defines_it() -> None:
    """LeaveGroupRequest.json, version 3: GroupId string, Members [MemberId string, GroupInstanceId
    nullable string] (non-flexible: int16 lengths, an int32 count)."""
    request = RemoveMembersRequest("orderly-worker", [("worker-1-abc", "worker-1"), ("m-2", None)])
    built = request.prepare({13: (0, 3)})
    assert built.API_VERSION == 3
    assert built.encode() == (kafka_string("orderly-worker") + struct.pack(">i", 2)
                              + kafka_string("worker-1-abc") + kafka_string("worker-1")
                              + kafka_string("m-2") + kafka_string(None))
    answer = LeaveGroupResponse_v3.decode(struct.pack(">ih", 0, 0) + struct.pack(">i", 1) + kafka_string("worker-1-abc")
                                          + kafka_string("worker-1") + struct.pack(">h", 82))
    assert (answer.error_code, answer.members) == (0, [("worker-1-abc", "worker-1", 82)])
