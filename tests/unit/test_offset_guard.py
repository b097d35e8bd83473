"""app.worker.OffsetGuard: a record beyond the next expected offset of its partition is a skip (the
committed offset is expected first); going back (records handed over again) never is."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.worker import OffsetGuard

offsets = st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=40)


@given(offsets, st.one_of(st.none(), st.integers(min_value=0, max_value=60)))
def test_a_skip_is_exactly_a_jump_past_the_next_expected_offset(seen: list[int], committed: int | None) -> None:
    guard = OffsetGuard()
    expected = committed
    for offset in seen:
        skipped = guard.skipped("tp", offset, committed)
        if expected is not None and offset > expected:
            assert skipped == expected
        else:
            assert skipped is None
        expected = offset + 1


def test_contiguous_records_and_records_again_are_not_skips_and_forget_starts_over() -> None:
    guard = OffsetGuard()
    assert [guard.skipped("p0", o, 98) for o in (98, 99, 100)] == [None, None, None]
    assert guard.skipped("p0", 98, 98) is None  # handed over again after a seek
    assert guard.skipped("p0", 150, 98) == 99  # the race: 99-149 never handed over
    assert guard.skipped("p1", 7, None) is None  # nothing committed yet: the first record is the start
    guard.forget(["p0"])
    assert guard.skipped("p0", 120, 98) == 98  # after a new assignment the committed offset comes first
    assert guard.skipped("p0", 121, 98) is None
