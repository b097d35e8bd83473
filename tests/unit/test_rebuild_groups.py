"""How a replay splits the partitions across its processes (app.replay._groups): pure, so a property."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.replay import Merged, _groups


@given(sizes=st.lists(st.integers(min_value=0, max_value=500), min_size=0, max_size=24),
       count=st.integers(min_value=1, max_value=8))
def test_every_partition_lands_in_exactly_one_balanced_group(sizes: list[int], count: int) -> None:
    merged: Merged = {p: [(b"k", b"v", [])] * size for p, size in enumerate(sizes)}
    groups = _groups(merged, count)
    flat = [p for group in groups for p in group]
    assert sorted(flat) == list(range(len(sizes)))  # each partition once
    assert all(group == sorted(group) for group in groups)  # decided in partition order
    assert len(groups) <= count and all(groups)  # no empty group, never more than asked
    loads = [sum(sizes[p] for p in group) for group in groups]
    if len(groups) > 1:  # largest-first greedy: no group exceeds another by more than one partition
        assert max(loads) - min(loads) <= max(sizes)
