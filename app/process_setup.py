"""How every Orderly process sets itself up before its work: the event loop, the garbage collector
and SIGTERM handled as Ctrl-C (process layer; app/cli.py
runs these for each command)."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Coroutine
from typing import Any


def use_event_loop(name: str) -> None:
    """uvloop unless ORDERLY_LOOP=asyncio: every process here is an asyncio loop, and the worker
    decides faster on uvloop (docs/benchmarks.md)."""
    if name == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    elif name != "asyncio":
        raise SystemExit(f"ORDERLY_LOOP must be uvloop or asyncio, not {name!r}")


def tune_gc(threshold: int) -> None:
    """Collect the young generation every ``threshold`` allocations instead of every 700, after
    moving what start-up built out of the collector's sight (gc.freeze). These processes allocate
    a few objects per record and keep few cycles, so most collections find nothing to free
    (docs/benchmarks.md). 0 keeps Python's default."""
    if threshold:
        gc.freeze()
        gc.set_threshold(threshold, 10, 10)


async def until_terminated(main: Coroutine[Any, Any, Any]) -> None:
    """Run ``main`` until it ends or SIGTERM arrives, which cancels it as Ctrl-C does: its
    ``finally`` clauses run — a consumer leaves its group, so a restarted one is given its
    partitions at once instead of after the dead member's session timeout (ORDERLY_SESSION_TIMEOUT_MS), and a producer
    flushes. Without a handler SIGTERM ended the process on the spot, cleaning up nothing."""
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if me is not None and me.cancelling():
            raise  # cancelled from outside (Ctrl-C through asyncio.run): asyncio.run makes it KeyboardInterrupt
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
