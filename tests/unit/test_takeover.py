"""Which static instances a group's member ids name (app/worker/takeover.py): the workers whose open
transaction a new owner of their partitions aborts."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from app.worker.takeover import instances, worker_transaction

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
