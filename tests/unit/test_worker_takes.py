"""The worker's loop over Faust's takes (app.worker.takes.decide_takes): every record decided once,
in order, in batches no larger than the maximum; a take cut short while a backlog waits held for
the next one, but for HOLD_MAX_S at most (the held records are decided alone when the next take is
late), and never while holding is not allowed (a rebalance or a stop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.pacing import BUSY_BATCH
from app.worker.takes import decide_takes

BATCH_MAX = 1000


def records(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


async def at_once(takes: list[list[int]]) -> AsyncIterator[Sequence[int]]:
    for take in takes:
        yield take


def run(takes: AsyncIterator[Sequence[int]], waiting: int, may_hold: bool = True,
        batch_max: int = BATCH_MAX) -> list[list[int]]:
    decided: list[list[int]] = []

    async def decide(batch: list[Any]) -> None:
        decided.append(list(batch))

    async def main() -> None:
        await asyncio.wait_for(decide_takes(takes, decide, lambda: waiting, lambda: may_hold, batch_max), 5)

    asyncio.run(main())
    return decided


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=BATCH_MAX), max_size=12), st.sampled_from([0, 99, 100, 5000]),
       st.booleans())
def test_every_record_is_decided_once_in_order_in_batches_of_at_most_the_maximum(
        sizes: list[int], waiting: int, may_hold: bool) -> None:
    takes, start = [], 0
    for size in sizes:
        takes.append(records(start, size))
        start += size
    decided = run(at_once(takes), waiting, may_hold)
    assert [r for batch in decided for r in batch] == list(range(start))
    assert all(0 < len(batch) <= BATCH_MAX for batch in decided)
    if not may_hold or waiting < BUSY_BATCH:  # nothing held: each take is its own batch
        assert decided == takes


def test_short_takes_with_a_backlog_behind_them_are_decided_with_the_next() -> None:
    assert run(at_once([records(0, 7), records(7, 8), records(15, 500)]), waiting=1500) == [records(0, 515)]
    # without a backlog, or while holding is not allowed, each take is decided as it comes
    assert run(at_once([records(0, 7), records(7, 8)]), waiting=0) == [records(0, 7), records(7, 8)]
    assert run(at_once([records(0, 7), records(7, 8)]), waiting=1500, may_hold=False) == [
        records(0, 7), records(7, 8)]


def test_held_records_go_first_when_the_next_take_would_make_more_than_a_batch() -> None:
    assert run(at_once([records(0, 50), records(50, 990)]), waiting=1500) == [records(0, 50), records(50, 990)]


def test_a_late_next_take_does_not_hold_the_records_longer_than_the_limit() -> None:
    """The second take comes only once the first one's records are decided: without the limit the
    loop would wait for it for ever (wait_for's 5 s fails the test)."""
    first_decided = asyncio.Event()

    async def late() -> AsyncIterator[Sequence[int]]:
        yield records(0, 7)
        await first_decided.wait()
        yield records(7, 3)

    decided: list[list[int]] = []

    async def decide(batch: list[Any]) -> None:
        decided.append(list(batch))
        first_decided.set()

    async def main() -> None:
        await asyncio.wait_for(decide_takes(late(), decide, lambda: 1500, lambda: True, BATCH_MAX), 5)

    asyncio.run(main())
    assert decided == [records(0, 7), records(7, 3)]


def test_stopping_the_loop_ends_the_take_it_was_waiting_for() -> None:
    ended = asyncio.Event()

    async def endless() -> AsyncIterator[Sequence[int]]:
        try:
            yield records(0, 7)
            await asyncio.sleep(3600)
            yield records(7, 1)
        finally:
            ended.set()

    async def decide(batch: list[Any]) -> None:
        return None

    async def main() -> None:
        loop = asyncio.ensure_future(decide_takes(endless(), decide, lambda: 1500, lambda: True, BATCH_MAX))
        await asyncio.sleep(0.2)  # the 7 records held, then decided alone; the next take awaited
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await asyncio.wait_for(ended.wait(), 1)

    asyncio.run(main())
