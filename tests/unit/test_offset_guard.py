"""app.worker.exits.OffsetGuard: a record beyond the highest offset handed over so far (the committed
offset before the first) is a skip; a record at or below it was handed over before (or committed)
and is not decided again."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st

from app.worker.exits import SKIPPED_EXIT_CODE, OffsetGuard

offsets = st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=40)


@given(offsets, st.one_of(st.none(), st.integers(min_value=0, max_value=60)),
       st.one_of(st.none(), st.integers(min_value=0, max_value=60)))
def test_skips_and_records_handed_again_match_the_offsets_seen_so_far(seen: list[int], committed: int | None,
                                                                       start: int | None) -> None:
    guard = OffsetGuard()
    # what a reader has been given, the committed part and (nothing committed) what precedes its start included
    covered: set[int] | None = set(range(committed)) if committed is not None else None
    for offset in seen:
        assert guard.needs_start("tp", committed) == (covered is None)
        again, skipped = guard.check("tp", offset, committed, start)
        if covered is None:  # the first record of a partition Faust knows no committed offset of
            # beyond where the broker says the consumer began: the records in between were skipped
            assert (again, skipped) == (False, start if start is not None and offset > start else None)
            if skipped is not None:
                return  # the worker exits here
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


def test_a_fresh_group_whose_first_record_handed_over_is_not_the_partitions_first_is_a_skip() -> None:
    """The skip seen in the production-shape test: a new group (nothing committed, so Faust knows no
    committed offset), orderly.raw[2]@0 never handed over, @1 first."""
    guard = OffsetGuard()
    assert guard.needs_start("p2", None)
    assert guard.check("p2", 1, None, 0) == (False, 0)
    guard.forget(["p2"])
    assert guard.check("p2", 0, None, 0) == (False, None)  # handed over from the start: no skip
    assert not guard.needs_start("p2", None)  # the start is known from here on
    assert guard.check("p2", 1, None) == (False, None)
    assert guard.check("p5", 3, None, 7) == (False, None)  # below the start the broker gave (retention): the start
    assert not guard.needs_start("p6", 12)  # Faust knows the committed offset: no question to the broker


class _Skipped(Exception):
    pass


class _Consumer:
    """What BatchProcessor.fresh asks of Faust's consumer, for a group that never committed."""

    def __init__(self, start: int | None, earliest: int) -> None:
        self.start, self.earliest, self.asked = start, earliest, 0

    def committed_offset(self, tp: object) -> None:
        return None

    async def start_offset(self, tp: object) -> int | None:
        self.asked += 1
        return self.start

    async def earliest_offsets(self, tp: object) -> dict[object, int]:
        return {tp: self.earliest}


def _fresh(monkeypatch: pytest.MonkeyPatch, consumer: _Consumer, offsets: list[int]) -> list[int]:
    """The offsets BatchProcessor.fresh lets through; raises _Skipped where the worker would exit."""
    from app.worker import batch

    def exit_for_restart(code: int, message: str, *args: object, **_kw: object) -> None:
        assert code == SKIPPED_EXIT_CODE
        raise _Skipped(message % args)

    monkeypatch.setattr(batch, "consumer_of", lambda _app: consumer)
    monkeypatch.setattr(batch, "exit_for_restart", exit_for_restart)
    processor = object.__new__(batch.BatchProcessor)
    processor.app, processor.guard = None, OffsetGuard()  # type: ignore[assignment]
    processor.metrics = SimpleNamespace(handed_again=SimpleNamespace(inc=lambda _n: None))  # type: ignore[assignment]
    tp = TP("orderly.raw", 2)
    events = [SimpleNamespace(message=SimpleNamespace(tp=tp, offset=o)) for o in offsets]
    return [e.message.offset for e in asyncio.run(processor.fresh(events))]


def test_the_worker_exits_when_a_fresh_groups_first_record_is_not_its_start(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _Consumer(start=0, earliest=0)
    with pytest.raises(_Skipped, match=r"orderly.raw\[2\] 0-0 were never handed"):
        _fresh(monkeypatch, consumer, [1, 2])
    assert _fresh(monkeypatch, _Consumer(start=0, earliest=0), [0, 1, 2]) == [0, 1, 2]
    consumer = _Consumer(start=None, earliest=0)  # the broker did not answer: the first record is the start
    assert _fresh(monkeypatch, consumer, [4, 5]) == [4, 5] and consumer.asked == 1  # asked once per partition
    # records below the start deleted by retention since (earliest now 9): not a skip
    assert _fresh(monkeypatch, _Consumer(start=3, earliest=9), [9]) == [9]
