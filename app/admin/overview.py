"""The overview's counts, shared by every console tab and API client of an admin process (I/O shell).

Counting deliveries by outcome reads the whole of ``webhook_events``, which only grows: 0.3 s at a
million deliveries, more than the 10 s a request may take at some tens of millions. Counted per
request, each open tab (its counts refresh every 5 s) kept a PostgreSQL backend scanning, and past
that size the overview answered 503 for good. Here one count runs at a time whoever asks; what it
counted stays fresh for a second, or ten times what counting took (so counting keeps at most a
tenth of one backend busy); a read of stale counts waits a moment for the next count and is
otherwise answered the last counts with their time (``counted_at``). An action an operator takes
makes them stale at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from app.waits import within

FRESH_S = 1.0  # counts younger than this are answered as they are
DUTY = 0.1  # counting may keep one backend busy this share of the time at most
WAIT_S = 2.0  # how long a read of stale counts waits for the next count before answering them


class StillCounting(Exception):
    """No counts yet, and the first count did not finish within the deadline (a large history)."""

    def __init__(self, running_s: float) -> None:
        super().__init__(f"the overview's counts are being read from PostgreSQL ({running_s:.0f} s so far); "
                         "ask again in a few seconds")


class SharedCounts:
    """``await counts.read()``: the counts ``count()`` returns, with ``counted_at`` (when the count
    began, UTC) and ``counting_s`` (how long it took)."""

    def __init__(self, count: Callable[[], Awaitable[dict[str, Any]]], *, first_wait_s: float,
                 took: Callable[[float], None] = lambda seconds: None, fresh_s: float = FRESH_S,
                 duty: float = DUTY, wait_s: float = WAIT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.count = count
        self.first_wait_s = first_wait_s
        self.took = took  # told each count's seconds (a gauge)
        self.fresh_s, self.duty, self.wait_s, self.clock = fresh_s, duty, wait_s, clock
        self.value: dict[str, Any] | None = None
        self.fresh_until = float("-inf")
        self.generation = 0  # raised by stale(): a count begun before it is not fresh when it ends
        self._running: asyncio.Task[dict[str, Any]] | None = None
        self._started = 0.0

    def stale(self) -> None:
        """Something changed (an operator's action): the next read counts again."""
        self.generation += 1
        self.fresh_until = float("-inf")

    async def read(self) -> dict[str, Any]:
        if self.value is not None and self.clock() < self.fresh_until:
            return self.value
        running = self._running or self._begin()
        # shielded: a reader that gives up (a closed tab) does not cancel the count the others wait for
        if self.value is None:
            try:
                return await within(asyncio.shield(running), self.first_wait_s)
            except TimeoutError:
                raise StillCounting(self.clock() - self._started) from None
        try:
            return await within(asyncio.shield(running), self.wait_s)
        except TimeoutError:
            return self.value  # a long count: the last counts, which say when they were made

    def _begin(self) -> asyncio.Task[dict[str, Any]]:
        self._started = self.clock()
        running = self._running = asyncio.get_running_loop().create_task(self._count(self.generation))
        running.add_done_callback(self._ended)
        return running

    async def _count(self, generation: int) -> dict[str, Any]:
        counted_at = datetime.now(UTC)
        started = self.clock()
        counts = await self.count()
        seconds = self.clock() - started
        self.took(seconds)
        self.value = {**counts, "counted_at": counted_at, "counting_s": round(seconds, 3)}
        if generation == self.generation:
            self.fresh_until = self.clock() + max(self.fresh_s, seconds / self.duty)
        return self.value

    def _ended(self, task: asyncio.Task[dict[str, Any]]) -> None:
        self._running = None
        if not task.cancelled():
            task.exception()  # a failed count is the waiting readers' to raise; retrieved here for the rest
