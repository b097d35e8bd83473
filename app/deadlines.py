"""The ingest's append deadlines: one timer for every append in flight (I/O shell)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class Pending:
    """One append under a deadline: while it is handed to the producer, the request's task (cancelled
    at the deadline); then the delivery future (failed at the deadline)."""

    __slots__ = ("deadline", "delivered", "expired", "finished", "task")

    def __init__(self, deadline: float, task: asyncio.Task[Any] | None) -> None:
        self.deadline = deadline
        self.task = task
        self.delivered: asyncio.Future[Any] | None = None
        self.expired = False
        self.finished = False


class Deadlines:
    """Appends failed once their deadline passes, by one timer for all of them instead of an
    ``asyncio.timeout`` (a timer handle and a context) per request. Every deadline is its start plus
    one ``timeout_s`` and appends are watched as they start, so the earliest is always first."""

    def __init__(self, timeout_s: float, tick_s: float = 0.05) -> None:
        self.timeout_s = timeout_s
        self.tick_s = tick_s
        self._pending: deque[Pending] = deque()

    def watch(self, started: float, task: asyncio.Task[Any] | None = None) -> Pending:
        """An append started at ``started`` (the loop's clock, not before the last one's)."""
        pending = Pending(started + self.timeout_s, task)
        self._pending.append(pending)
        return pending

    def expire(self, now: float) -> int:
        """Fail the appends whose deadline is past and forget the finished ones; how many failed."""
        queue = self._pending
        failed = 0
        while queue:
            pending = queue[0]
            if not pending.finished:
                if pending.deadline > now:
                    break
                pending.expired = True
                if pending.delivered is not None:
                    if not pending.delivered.done():
                        pending.delivered.set_exception(TimeoutError())
                elif pending.task is not None:
                    pending.task.cancel()  # still waiting in the producer (buffer full, no metadata)
                failed += 1
            queue.popleft()
        return failed

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.tick_s)
            self.expire(loop.time())
