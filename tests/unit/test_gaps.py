"""Sequence gaps: recorded with their first-seen time, closed by late events, never waited on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.core.gaps import Gap, due_for_backfill, observe


def fold(seqs: list[int], now: int = 0) -> tuple[int | None, list[Gap]]:
    max_seen: int | None = None
    gaps: list[Gap] = []
    for i, s in enumerate(seqs):
        max_seen, gaps = observe(max_seen, gaps, s, now + i)
    return max_seen, gaps


def test_gap_opens_and_closes() -> None:
    assert fold([1, 2, 5]) == (5, [Gap(3, 4, 2)])
    assert fold([1, 2, 5, 3]) == (5, [Gap(4, 4, 2)])
    assert fold([1, 2, 5, 4, 3]) == (5, [])
    assert fold([1, 5, 3]) == (5, [Gap(2, 2, 1), Gap(4, 4, 1)])


def test_backfill_only_after_the_limit() -> None:
    _, gaps = fold([1, 5])
    assert due_for_backfill(gaps, now_ms=1000, after_ms=5000) == []
    assert due_for_backfill(gaps, now_ms=6001, after_ms=5000) == gaps


@given(st.permutations(list(range(1, 40))), st.integers(0, 38))
def test_gaps_are_exactly_the_missing_numbers(order: list[int], cut: int) -> None:
    seen = order[:cut + 1]
    max_seen, gaps = fold(seen + seen[:3])  # duplicates change nothing
    missing = {n for g in gaps for n in range(g.start, g.end + 1)}
    assert max_seen == max(seen)
    # tracking starts at the first number seen: history below it is not a gap
    assert missing == set(range(seen[0], max(seen) + 1)) - set(seen)
