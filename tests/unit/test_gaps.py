"""Sequence gaps: recorded with their first-seen time, closed by late events, never waited on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.core.gaps import Gap, due_for_backfill, observe, observe_all


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


def fold_all(seqs: list[int], now: int = 0) -> tuple[int | None, list[Gap]]:
    folded = observe_all(None, [], [(s, now + i) for i, s in enumerate(seqs)])
    return folded.max_seen, folded.gaps


sequences = st.lists(st.integers(1, 60), max_size=40)


@given(sequences, sequences)
def test_a_batch_folds_as_one_number_at_a_time(first: list[int], batch: list[int]) -> None:
    """observe_all over a batch is observe over each number in turn, and says exactly which given
    gaps changed or closed and which are new, each new one with the given gap that held it."""
    max_seen, before = fold(first)
    expected_max, expected = max_seen, before
    for i, s in enumerate(batch):
        expected_max, expected = observe(expected_max, expected, s, 1000 + i)
    folded = observe_all(max_seen, before, [(s, 1000 + i) for i, s in enumerate(batch)])
    assert (folded.max_seen, folded.gaps) == (expected_max, expected)
    assert set(folded.removed) == set(before) - set(expected)
    assert {gap for gap, _ in folded.added} == set(expected) - set(before)
    for gap, origin in folded.added:
        holding: list[Gap | None] = [b for b in before if b.start <= gap.start and gap.end <= b.end]
        assert [origin] == (holding or [None])
    assert before == fold(first)[1]  # the given list is not changed


@given(sequences, sequences)
def test_the_gaps_holding_the_late_numbers_are_enough(first: list[int], batch: list[int]) -> None:
    """The projector reads only the gaps the batch's numbers up to the highest seen fall in: the
    changes are those of a fold over every open gap."""
    max_seen, before = fold(first)
    seen = [(s, 1000 + i) for i, s in enumerate(batch)]
    whole = observe_all(max_seen, before, seen)
    holding = [g for g in before if any(g.start <= s <= g.end for s in batch)]
    part = observe_all(max_seen, holding, seen)
    assert part.max_seen == whole.max_seen
    assert part.removed == whole.removed
    assert part.added == whole.added


def test_a_broken_sequence_leaves_a_gap_per_number() -> None:
    """Every number two past the last: a gap each, all new, none with a given gap to come from."""
    folded = observe_all(1, [], [(n, n) for n in range(3, 2003, 2)])
    assert folded.max_seen == 2001
    assert folded.gaps == [Gap(n - 1, n - 1, n) for n in range(3, 2003, 2)]
    assert [origin for _, origin in folded.added] == [None] * 1000
    assert folded.removed == []


def test_a_number_below_a_gap_opened_in_the_same_batch_cuts_the_gap_it_falls_in() -> None:
    """A gap opened by the batch is found at its own start: 4 falls in 2-4, not in 6-7 opened by 8."""
    folded = observe_all(5, [Gap(2, 4, 0)], [(8, 1), (4, 2), (7, 3)])
    assert (folded.max_seen, folded.gaps) == (8, [Gap(2, 3, 0), Gap(6, 6, 1)])
    assert folded.removed == [Gap(2, 4, 0)]
    assert folded.added == [(Gap(2, 3, 0), Gap(2, 4, 0)), (Gap(6, 6, 1), None)]


def test_the_pieces_of_a_gap_whose_backfill_was_requested_keep_the_request() -> None:
    given = [Gap(10, 20, 5, backfill_requested=True), Gap(30, 40, 6)]
    expected_max, expected = 50, given
    for seq in (15, 10, 35):
        expected_max, expected = observe(expected_max, expected, seq, 99)
    folded = observe_all(50, given, [(15, 99), (10, 99), (35, 99)])
    assert folded.gaps == expected == [Gap(11, 14, 5, True), Gap(16, 20, 5, True), Gap(30, 34, 6), Gap(36, 40, 6)]
