"""The worker's loop over its takes (app.worker.takes.decide_takes): every record decided once,
in order, in batches no larger than the maximum; a take cut short while a backlog waits held for
the next one, but for HOLD_MAX_S at most (the held records are decided alone when the next take is
late), and never while holding is not allowed (a rebalance or a stop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.pacing import BUSY_BATCH, HOLD_MAX_S
from app.worker.takes import decide_takes

BATCH_MAX = 1000


def records(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


async def at_once(takes: list[list[int]]) -> AsyncIterator[Sequence[int]]:
    for take in takes:
        yield take


def run(takes: AsyncIterator[Sequence[int]], waiting: int, may_hold: bool = True,
        batch_max: int = BATCH_MAX) -> list[list[int]]:
    """The batches decided; the clock stands still (no hold runs out), so that a slow machine
    cannot split what the rule merges."""
    decided: list[list[int]] = []

    async def decide(batch: list[Any]) -> None:
        decided.append(list(batch))

    async def main() -> None:
        await asyncio.wait_for(decide_takes(takes, decide, lambda: waiting, lambda: may_hold, batch_max,
                                            clock=lambda: 0.0), 5)

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
    loop would wait for it for ever (wait_for's 5 s fails the test), and they are decided within a
    few times HOLD_MAX_S."""
    first_decided = asyncio.Event()
    decided: list[list[int]] = []
    waited: list[float] = []

    async def late() -> AsyncIterator[Sequence[int]]:
        yield records(0, 7)
        started = time.monotonic()
        await first_decided.wait()
        waited.append(time.monotonic() - started)
        yield records(7, 3)

    async def decide(batch: list[Any]) -> None:
        decided.append(list(batch))
        first_decided.set()

    async def main() -> None:
        await asyncio.wait_for(decide_takes(late(), decide, lambda: 1500, lambda: True, BATCH_MAX), 5)

    asyncio.run(main())
    assert decided == [records(0, 7), records(7, 3)]
    assert HOLD_MAX_S * 0.9 <= waited[0] < 20 * HOLD_MAX_S  # held, and not for long (1 s: a busy lane's slack)


def test_records_held_when_holding_stops_being_allowed_are_decided_first() -> None:
    """A rebalance begins while records are held: they are decided within the limit, before the
    take that comes after them, which is not held (holding is no longer allowed)."""
    allowed = [True]
    decided: list[list[int]] = []

    async def takes() -> AsyncIterator[Sequence[int]]:
        yield records(0, 7)
        allowed[0] = False
        await asyncio.sleep(4 * HOLD_MAX_S)
        yield records(7, 5)

    async def decide(batch: list[Any]) -> None:
        decided.append(list(batch))

    async def main() -> None:
        await asyncio.wait_for(decide_takes(takes(), decide, lambda: 1500, lambda: allowed[0], BATCH_MAX), 5)

    asyncio.run(main())
    assert decided == [records(0, 7), records(7, 5)]


class Endless:
    """Takes of 7 records while 1,500 wait, the second one never coming; says when it was ended."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    async def takes(self) -> AsyncIterator[Sequence[int]]:
        try:
            yield records(0, 7)
            await asyncio.sleep(3600)
            yield records(7, 1)
        finally:
            self.ended.set()


@pytest.mark.parametrize("where", ["holding", "deciding", "awaiting the next take"])
def test_stopping_the_loop_ends_the_take_under_way_and_leaves_no_task(where: str) -> None:
    async def main() -> None:
        source = Endless()
        in_decide = asyncio.Event()

        async def decide(batch: list[Any]) -> None:
            in_decide.set()
            await asyncio.sleep(3600)  # stopped while deciding

        async def quick(batch: list[Any]) -> None:
            return None

        loop = asyncio.ensure_future(decide_takes(source.takes(), decide if where == "deciding" else quick,
                                                  lambda: 1500, lambda: True, BATCH_MAX))
        if where == "holding":
            await asyncio.sleep(HOLD_MAX_S / 5)  # the 7 records held, waiting for the next take
        elif where == "deciding":
            await asyncio.wait_for(in_decide.wait(), 1)  # the hold ran out: deciding them alone
        else:
            await asyncio.sleep(4 * HOLD_MAX_S)  # decided alone; the next take awaited
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await asyncio.wait_for(source.ended.wait(), 1)
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(main())
