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

from app.worker.exits import REWINDS_MAX, SKIPPED_EXIT_CODE, OffsetGuard

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
            if skipped is not None:  # fetched again from there
                assert guard.rewound("tp", skipped)
                covered = set(range(skipped))
                continue
            covered = set(range(offset + 1))
            continue
        assert again == (offset in covered)
        missing = sorted(set(range(offset)) - covered)
        assert skipped == (missing[0] if missing else None), (offset, sorted(covered))
        if skipped is not None:  # fetched again from there: the record expected next
            assert guard.rewound("tp", skipped)
            covered = set(range(skipped))
            continue
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

    def __init__(self, start: int | None, earliest: int, seeks: bool = True) -> None:
        self.start, self.earliest, self.asked, self.seeks = start, earliest, 0, seeks
        self.rewound: list[int] = []

    def committed_offset(self, tp: object) -> None:
        return None

    async def start_offset(self, tp: object) -> int | None:
        self.asked += 1
        return self.start

    async def earliest_offsets(self, tp: object) -> dict[object, int]:
        return {tp: self.earliest}

    async def rewind(self, tp: object, offset: int) -> bool:
        self.rewound.append(offset)
        return self.seeks


def _processor(monkeypatch: pytest.MonkeyPatch, consumer: _Consumer) -> object:
    """A BatchProcessor with just what ``fresh`` uses; exit_for_restart raises _Skipped."""
    from app.logs import SampledLog
    from app.worker import batch

    def exit_for_restart(code: int, message: str, *args: object, **_kw: object) -> None:
        assert code == SKIPPED_EXIT_CODE
        raise _Skipped(message % args)

    monkeypatch.setattr(batch, "consumer_of", lambda _app: consumer)
    monkeypatch.setattr(batch, "exit_for_restart", exit_for_restart)
    processor = object.__new__(batch.BatchProcessor)
    processor.app, processor.guard = None, OffsetGuard()  # type: ignore[assignment]
    processor.sampled = SampledLog(batch.log)
    counted = SimpleNamespace(again=0, rewinds=0)
    processor.metrics = SimpleNamespace(  # type: ignore[assignment]
        handed_again=SimpleNamespace(inc=lambda n=1: setattr(counted, "again", counted.again + n)),
        rewinds=SimpleNamespace(inc=lambda n=1: setattr(counted, "rewinds", counted.rewinds + n)))
    processor.counted = counted  # type: ignore[attr-defined]
    return processor


def _fresh(processor: object, offsets: list[int]) -> list[int]:
    """The offsets BatchProcessor.fresh lets through (raises _Skipped where the worker would exit)."""
    tp = TP("orderly.raw", 2)
    events = [SimpleNamespace(message=SimpleNamespace(tp=tp, offset=o)) for o in offsets]
    return [e.message.offset for e in asyncio.run(processor.fresh(events))]  # type: ignore[attr-defined]


def test_a_skip_is_fetched_again_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The skip seen at rebalances: a new group's raw[2]@0 never handed over, @1 first. The partition
    is fetched again from 0 and nothing after the skip is decided before it."""
    consumer = _Consumer(start=0, earliest=0)
    processor = _processor(monkeypatch, consumer)
    assert _fresh(processor, [1, 2]) == [] and consumer.rewound == [0]
    assert _fresh(processor, [3]) == [] and consumer.rewound == [0, 0]  # a stale record after the rewind
    assert _fresh(processor, [0, 1, 2, 3]) == [0, 1, 2, 3]  # fetched again, in order
    assert _fresh(processor, [2, 3, 4]) == [4]  # handed over again: not decided twice
    assert (processor.counted.again, processor.counted.rewinds) == (2, 2)  # type: ignore[attr-defined]
    assert _fresh(processor, [5, 9, 10]) == [5] and consumer.rewound == [0, 0, 6]
    assert _fresh(processor, [6, 7, 8, 9]) == [6, 7, 8, 9]


def test_the_worker_exits_when_a_skip_cannot_be_fetched_again(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(_Skipped, match=r"orderly.raw\[2\] 0-0 were never handed.*could not be fetched again"):
        _fresh(_processor(monkeypatch, _Consumer(start=0, earliest=0, seeks=False)), [1, 2])
    processor = _processor(monkeypatch, _Consumer(start=0, earliest=0))
    for _ in range(REWINDS_MAX):  # a partition that keeps skipping, no record in order between
        assert _fresh(processor, [1]) == []
    with pytest.raises(_Skipped, match="could not be fetched again"):
        _fresh(processor, [1])


def test_the_start_comes_from_the_broker_once_and_retention_is_no_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _Consumer(start=None, earliest=0)  # the broker did not answer: the first record is the start
    assert _fresh(_processor(monkeypatch, consumer), [4, 5]) == [4, 5] and consumer.asked == 1  # once per partition
    # records below the start deleted by retention since (earliest now 9): not a skip
    consumer = _Consumer(start=3, earliest=9)
    assert _fresh(_processor(monkeypatch, consumer), [9]) == [9] and consumer.rewound == []
    # some deleted (0-2), some skipped (3-4): fetched again from the earliest held, 3
    consumer = _Consumer(start=0, earliest=3)
    processor = _processor(monkeypatch, consumer)
    assert _fresh(processor, [5]) == [] and consumer.rewound == [3]
    assert _fresh(processor, [3, 4, 5]) == [3, 4, 5]
