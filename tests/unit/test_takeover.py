"""Which static instances a group's member ids name (app/worker/takeover.py): the workers whose open
transaction a new owner of their partitions aborts."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from app.worker.takeover import MEMBERS_KNOWN, gone, instances, worker_transaction

INSTANCE = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_.{}"), min_size=1, max_size=40)


@given(st.lists(INSTANCE, max_size=6), st.lists(st.uuids(), min_size=6, max_size=6))
def test_the_instances_are_read_back_from_kafkas_static_member_ids(names: list[str], ids: list[uuid.UUID]) -> None:
    members = [f"{name}-{member_id}" for name, member_id in zip(names, ids, strict=False)]
    assert instances(members) == set(names)


def test_a_member_id_without_a_uuid_names_no_instance() -> None:
    assert instances(["worker-1", "worker-1-", "worker-1-1234", f"-{uuid.uuid4()}", ""]) == set()
    assert instances([f"worker-1-{uuid.uuid4()}", f"worker-2-{uuid.uuid4()}"]) == {"worker-1", "worker-2"}


def test_the_transactional_id_is_the_one_the_worker_commits_under() -> None:
    # app/worker/app.py exactly_once names the worker's producer with the same function
    assert worker_transaction("orderly-worker", "worker-2") == "orderly-worker-worker-worker-2"


STATES = st.sampled_from([*sorted(MEMBERS_KNOWN), "Empty", "Dead", "Unknown"])


@given(st.none() | st.sets(INSTANCE, max_size=5), st.sets(INSTANCE, max_size=5), INSTANCE,
       st.sampled_from([0, 0, 0, 15, 16]), STATES)
def test_only_an_answer_that_holds_this_worker_names_the_gone_and_never_this_worker(
        before: set[str] | None, now: set[str], own: str, error_code: int, state: str) -> None:
    members = [f"{name}-{uuid.uuid4()}" for name in now]
    left, remembered = gone(before, error_code, state, members, own)
    assert own not in left
    if error_code == 0 and state in MEMBERS_KNOWN and own in now:
        assert left == (before or set()) - now and remembered == now
    else:  # a coordinator that lost or is loading the group, or an answer without this worker
        assert left == set() and remembered == before


def test_a_worker_gone_from_a_stable_group_is_named_once() -> None:
    one, two = f"worker-1-{uuid.uuid4()}", f"worker-2-{uuid.uuid4()}"
    left, members = gone(None, 0, "Stable", [one, two], "worker-1")
    assert (left, members) == (set(), {"worker-1", "worker-2"})  # the first look only remembers
    left, members = gone(members, 0, "Stable", [one], "worker-1")
    assert (left, members) == ({"worker-2"}, {"worker-1"})
    assert gone(members, 0, "Stable", [one], "worker-1")[0] == set()
    # NOT_COORDINATOR (16) with no members: nothing gone, this worker least of all
    assert gone({"worker-1", "worker-2"}, 16, "Dead", [], "worker-1") == (set(), {"worker-1", "worker-2"})
