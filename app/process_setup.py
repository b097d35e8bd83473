"""How every Orderly process sets itself up before its work: the event loop, the garbage collector
and SIGTERM handled as Ctrl-C (process layer; app/cli.py
runs these for each command)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("orderly.process")


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
    dump_tasks_on_usr1()
    try:
        await task
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if me is not None and me.cancelling():
            raise  # cancelled from outside (Ctrl-C through asyncio.run): asyncio.run makes it KeyboardInterrupt
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if loop.remove_signal_handler(signal.SIGUSR1):
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # not the default, which would end the process


def dump_tasks_on_usr1() -> None:
    """From now on, ``kill -USR1 <pid>`` logs where this process's tasks wait (:func:`dump_tasks`).
    Only a loop of the main thread can take signals: one in another thread (a test's) goes without."""
    if threading.current_thread() is threading.main_thread():
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)


def dump_tasks() -> None:
    """kill -USR1 <pid>: log, as warnings, where every asyncio task of the process is waiting (for a
    process that looks stuck, or does not stop on SIGTERM). The worker logs it too before it ends
    itself for a stall (app/worker/runtime.py)."""
    for task in asyncio.all_tasks():
        frames: list[str] = []
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            if frame is not None:
                frames.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
        log.warning("task %s:\n%s", task.get_name(), "\n".join(frames))
