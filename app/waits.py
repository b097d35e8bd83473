"""Waiting with a deadline without losing a cancellation (every process).

``asyncio.wait_for`` of Python 3.11 returns the awaited result when its task is cancelled in the
same turn of the loop as that result arrives: the cancellation is lost (python/cpython#86296,
fixed in 3.12 by building ``wait_for`` on ``asyncio.timeout``). A process stopped by SIGTERM
(app/process_setup.until_terminated) cancels its tasks once; a task that loses that cancellation
runs on, and the process never stops (a projector's gauge loop did, seen in CI). ``within`` is
``asyncio.timeout`` around the await, which counts its cancellations and never loses one;
tests/unit/test_waits.py shows both, and app/ uses no ``asyncio.wait_for``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """``await awaitable``, cancelled after ``seconds`` with TimeoutError, as ``asyncio.wait_for``
    does but without losing a cancellation of the caller."""
    async with asyncio.timeout(seconds):
        return await awaitable
