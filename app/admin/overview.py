"""The overview's counts, shared by every console tab and API client of an admin process (I/O shell).

Counting deliveries by outcome reads the whole of ``webhook_events``, which only grows: 0.2 s at a
million deliveries, more than the 10 s a request may take at some tens of millions. Counted per
request, each open tab (its counts refresh every 5 s) kept a PostgreSQL backend scanning, and past
that size the overview answered 503 for good. Here one count runs at a time whoever asks; what it
counted stays fresh for a second, or ten times what counting took (so counting keeps at most a
tenth of one backend busy); a read of stale counts waits a moment for the next count and is
otherwise answered the last counts with their time (``counted_at``). An operator's action (this
process's, another admin's or a command's: ``changed`` reads the audit) makes them stale; a count
that failed is retried after a back-off, the last counts answered meanwhile with why
(``count_error``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, NamedTuple

from app.waits import within

log = logging.getLogger("orderly.admin")

FRESH_S = 1.0  # counts younger than this are answered as they are
DUTY = 0.1  # counting may keep one backend busy this share of the time at most
WAIT_S = 2.0  # how long a read of stale counts waits for the next count before answering them
RETRY_S = (1.0, 60.0)  # the back-off after a failed count: first, most


class Counted(NamedTuple):
    counts: dict[str, Any]
    at: datetime  # when the count began reading (its connection in hand)
    seconds: float  # how long reading took


class NoCounts(Exception):
    """No counts to answer (503)."""


class StillCounting(NoCounts):
    """No counts yet, and the first count did not finish within the deadline (a large history)."""

    def __init__(self, running_s: float) -> None:
        super().__init__(f"the overview's counts are being read from PostgreSQL ({running_s:.0f} s so far); "
                         "ask again in a few seconds")


class CountFailed(NoCounts):
    """No counts yet, and the last count failed: tried again after a back-off."""

    def __init__(self, why: str | None, retry_in_s: float) -> None:
        super().__init__(f"the overview's counts could not be read ({why}); trying again in {retry_in_s:.0f} s")


class SharedCounts:
    """``await counts.read()``: the counts ``count()`` returns, with ``counted_at``, ``counting_s``
    and ``count_error`` (why the last count failed, when the counts answered are older than it)."""

    def __init__(self, count: Callable[[], Awaitable[Counted]], *, first_wait_s: float,
                 changed: Callable[[], Awaitable[datetime | None]] | None = None,
                 took: Callable[[float], None] = lambda seconds: None,
                 failed: Callable[[BaseException], None] = lambda exc: None, fresh_s: float = FRESH_S,
                 duty: float = DUTY, wait_s: float = WAIT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.count = count
        self.first_wait_s = first_wait_s
        self.changed = changed  # when an operator last changed something, as the audit says
        self.took = took  # told each count's seconds (a gauge)
        self.failed = failed  # told each failed count (a counter)
        self.fresh_s, self.duty, self.wait_s, self.clock = fresh_s, duty, wait_s, clock
        self.value: dict[str, Any] | None = None
        self.fresh_until = float("-inf")
        self.generation = 0  # raised by stale(): a count begun before it is not fresh when it ends
        self.error: BaseException | None = None  # the last count's failure, until one succeeds
        self.retry_at = float("-inf")
        self._retry_s = RETRY_S[0]
        self._running: asyncio.Task[dict[str, Any]] | None = None
        self._started = 0.0
        self._next_at = float("-inf")  # a count ends no sooner than it took after the last: at most half the time
        self._checked_at = float("-inf")  # when the audit was last asked (changed)
        self._last_change: datetime | None = None

    def stale(self) -> None:
        """Something changed (an operator's action): the next read counts again, and a count under
        way counts once more before it answers."""
        self.generation += 1
        self.fresh_until = float("-inf")

    async def read(self) -> dict[str, Any]:
        value = self.value
        if value is not None and self.clock() < self.fresh_until:
            if not await self._changed_since(value["counted_at"]):
                return value
            self.stale()
        running = self._running
        if running is None or running.done():  # done, its callback not run yet: over all the same
            now = self.clock()
            if now < self.retry_at:  # backing off after a failure
                if value is None:
                    raise CountFailed(kind_only(self.error), self.retry_at - now)
                return {**value, "count_error": kind_only(self.error)}
            if value is not None and now < self._next_at:  # stale at once again (actions one after another)
                return value
            running = self._begin()
        # shielded: a reader that gives up (a closed tab) does not cancel the count the others wait for
        try:
            return await within(asyncio.shield(running), self.first_wait_s if value is None else self.wait_s)
        except TimeoutError:
            if not running.done():
                if value is None:
                    raise StillCounting(self.clock() - self._started) from None
                # a long count: the last counts, which say when they were made (and why none is newer)
                return value if self.error is None else {**value, "count_error": kind_only(self.error)}
        except Exception:  # the count failed: said below, as the back-off will
            pass
        if not running.cancelled() and running.exception() is None:
            return running.result()  # it ended just as the wait did
        why = kind_only(running.exception() if not running.cancelled() else None)
        latest = self.value  # the failed count may have kept what it counted before an action
        if latest is None:
            raise CountFailed(why, max(0.0, self.retry_at - self.clock()))
        return {**latest, "count_error": why}

    async def _changed_since(self, counted_at: datetime) -> bool:
        """Whether the audit names an action at or after ``counted_at``: asked at most once in
        ``fresh_s`` (every reader's fresh read would ask); PostgreSQL away, the fresh counts stand."""
        if self.changed is None:
            return False
        if self.clock() - self._checked_at >= self.fresh_s:
            self._checked_at = self.clock()
            try:
                self._last_change = await self.changed()
            except Exception as exc:  # the counts are fresh; the next count says what is wrong
                log.debug("reading the audit's last change: %r", exc)
        return self._last_change is not None and self._last_change >= counted_at

    async def close(self) -> None:
        """Stop a count under way (the admin stopping: its connection goes back to the pool)."""
        if self._running is not None and not self._running.done():
            self._running.cancel()
            await asyncio.gather(self._running, return_exceptions=True)

    def _begin(self) -> asyncio.Task[dict[str, Any]]:
        self._started = self.clock()
        running = self._running = asyncio.get_running_loop().create_task(self._count())
        running.add_done_callback(self._ended)
        return running

    async def _count(self) -> dict[str, Any]:
        busy = 0.0  # what counting kept PostgreSQL busy, both counts when it counted twice
        before: Counted | None = None  # a count an action came during, while it is counted again
        try:
            for _ in range(2):  # once more if an action came during the first: what it changed is read
                generation = self.generation
                counted = await self.count()
                busy += counted.seconds
                if generation == self.generation:
                    break
                before = counted
        except Exception as exc:
            if before is not None:  # the recount failed: the count before it is still newer than the last
                self.took(before.seconds)
                self.value = {**self._answer(before), "count_error": kind_only(exc)}
            # set here, not in the done callback a turn later: a read in between must see the back-off
            self.error = exc
            self.retry_at = self.clock() + self._retry_s
            self._retry_s = min(self._retry_s * 2, RETRY_S[1])
            self.failed(exc)
            log.warning("the overview's count failed, tried again in %.0f s: %r", self.retry_at - self.clock(), exc)
            raise
        self.took(counted.seconds)
        self._next_at = self.clock() + busy
        self.value = self._answer(counted)
        self.error, self._retry_s, self.retry_at = None, RETRY_S[0], float("-inf")
        if generation == self.generation:
            self.fresh_until = self.clock() + max(self.fresh_s, counted.seconds / self.duty)
        return self.value

    @staticmethod
    def _answer(counted: Counted) -> dict[str, Any]:
        return {**counted.counts, "counted_at": counted.at, "counting_s": round(counted.seconds, 3),
                "count_error": None}

    def _ended(self, task: asyncio.Task[dict[str, Any]]) -> None:
        if self._running is task:
            self._running = None
        if not task.cancelled():
            task.exception()  # retrieved: the failure was told and logged by _count


def kind_only(exc: BaseException | None) -> str | None:
    """What a viewer is told of a failure (a count, the lag's measure): its kind only (a PostgreSQL or
    Kafka error's text can name a host, a user or a statement); the admin's log has the rest."""
    return None if exc is None else f"{type(exc).__name__}; the admin's log says more"
