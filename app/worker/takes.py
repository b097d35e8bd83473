"""The worker's loop over its takes (app/seams/faust/handover.py): a take cut short while a backlog
waits is held and decided with the next one, for a bounded time (I/O shell; the rule is
app/core/pacing.py's hold_take)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from app.core.pacing import HOLD_MAX_S, hold_take


async def decide_takes(takes: AsyncIterator[Sequence[Any]], decide: Callable[[list[Any]], Awaitable[None]],
                       waiting: Callable[[], int], may_hold: Callable[[], bool], batch_max: int,
                       clock: Callable[[], float] = time.monotonic) -> None:
    """Decide every record of ``takes`` in order, in batches of at most ``batch_max``. A take of
    fewer than BUSY_BATCH records while ``waiting()`` says a backlog waits behind it is held for the
    next take, but never longer than HOLD_MAX_S: when the next take is not there by then, the held
    records are decided alone (the next take goes on meanwhile, taking up to a batch of records from
    the handover's queue, and is awaited afterwards: nothing is dropped or reordered). Nothing is
    held unless ``may_hold()`` (the worker: not during a rebalance or a stop, when no next take
    may come and Faust waits for every record it handed over to be acknowledged)."""
    held: list[Any] = []
    held_since = 0.0
    next_take: asyncio.Future[Sequence[Any]] | None = None
    try:
        while True:
            if next_take is None:
                next_take = asyncio.ensure_future(takes.__anext__())
            if held:
                done, _ = await asyncio.wait({next_take}, timeout=max(0.0, held_since + HOLD_MAX_S - clock()))
                if not done:  # held long enough: decide them, the take under way comes next
                    batch, held = held, []
                    await decide(batch)
                    continue
            try:
                took = await next_take
            except StopAsyncIteration:
                break
            finally:
                if next_take.done():
                    next_take = None
            if len(held) + len(took) > batch_max:  # never more than a batch: the held records go first
                batch, held = held, []
                await decide(batch)
            if not held:
                held_since = clock()
            held.extend(took)
            if may_hold() and hold_take(len(held), waiting(), clock() - held_since, batch_max):
                continue
            batch, held = held, []
            await decide(batch)
        if held:  # the takes ended (a stream ends only as the worker stops): decide what is left
            await decide(held)
    finally:  # stopped (or failed): end the take under way, whatever it ended with
        if next_take is not None:
            next_take.cancel()
            await asyncio.gather(next_take, return_exceptions=True)
