"""app.worker.exits.OffsetGuard: a record beyond the highest offset handed over so far (the committed
offset before the first) is a skip; a record at or below it was handed over before (or committed)
and is not decided again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.worker.exits import OffsetGuard

offsets = st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=40)


@given(offsets, st.one_of(st.none(), st.integers(min_value=0, max_value=60)))
def test_skips_and_records_handed_again_match_the_offsets_seen_so_far(seen: list[int], committed: int | None) -> None:
    guard = OffsetGuard()
    # what a reader has been given, the committed part and (nothing committed) what precedes its start included
    covered: set[int] | None = set(range(committed)) if committed is not None else None
    for offset in seen:
        again, skipped = guard.check("tp", offset, committed)
        if covered is None:  # the first record of a partition with nothing committed: the start
            assert (again, skipped) == (False, None)
            covered = set(range(offset + 1))
            continue
        assert again == (offset in covered)
        missing = sorted(set(range(offset)) - covered)
        assert skipped == (missing[0] if missing else None), (offset, sorted(covered))
        if skipped is not None:
            return  # the worker exits here
        covered.add(offset)


def test_contiguous_records_and_records_again_then_forget_starts_over() -> None:
    guard = OffsetGuard()
    assert [guard.check("p0", o, 98) for o in (98, 99, 100)] == [(False, None)] * 3
    assert guard.check("p0", 98, 98) == (True, None)  # handed over again after a seek
    assert guard.check("p0", 99, 98) == (True, None)
    assert guard.check("p0", 101, 98) == (False, None)  # back past the highest: new again
    assert guard.check("p0", 150, 98) == (False, 102)  # the race: 102-149 never handed over
    assert guard.check("p1", 7, None) == (False, None)  # nothing committed yet: the first record is the start
    assert guard.check("p1", 3, None) == (True, None)
    assert guard.check("p2", 40, 50) == (True, None)  # below the committed offset: decided and committed
    guard.forget(["p0"])
    assert guard.check("p0", 120, 98) == (False, 98)  # after a new assignment the committed offset comes first
    assert guard.check("p0", 121, 98) == (False, None)
