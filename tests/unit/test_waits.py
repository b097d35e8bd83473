"""A process stopped by SIGTERM stops: no wait loses the cancellation that stops it (app/waits.py),
a task beside the main loop cannot hold the stop (app/metrics.beside), a sink's pool closes when its
consumer's stop fails, and SIGUSR1 says where every task waits (app/process_setup.dump_tasks)."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from app import metrics
from app.metrics import beside
from app.process_setup import dump_tasks, until_terminated
from app.settings import DEV_DEFAULTS, Settings
from app.sink import PgSink
from app.waits import within
from tests import parsing

ROOT = Path(__file__).resolve().parents[2]


async def cancelled_as_result_arrives(wait: Callable[[asyncio.Future[int]], Awaitable[int]]) -> str:
    """Cancel a task waiting under a deadline in the same turn of the loop as its result arrives:
    what SIGTERM does to a process's loop that was just handed a reading."""
    result: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def waiting() -> str:
        return f"returned {await wait(result)}"

    task = asyncio.ensure_future(waiting())
    for _ in range(3):
        await asyncio.sleep(0)
    result.set_result(1)
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return "cancelled"


def test_within_keeps_the_cancellation_that_asyncio_wait_for_of_python_3_11_loses() -> None:
    lost = asyncio.run(cancelled_as_result_arrives(lambda f: asyncio.wait_for(f, 5)))
    kept = asyncio.run(cancelled_as_result_arrives(lambda f: within(f, 5)))
    assert lost == ("returned 1" if sys.version_info < (3, 12) else "cancelled")
    assert kept == "cancelled"


def test_within_ends_a_slow_wait_with_timeout_error_and_cancels_it() -> None:
    async def scenario() -> tuple[type[BaseException], bool]:
        slow = asyncio.ensure_future(asyncio.sleep(10))
        with pytest.raises(TimeoutError) as raised:
            await within(slow, 0.01)
        await asyncio.sleep(0)
        return raised.type, slow.cancelled()

    assert asyncio.run(scenario()) == (TimeoutError, True)
    assert asyncio.run(within(asyncio.sleep(0, "done"), 1)) == "done"


def wait_fors(source: str, name: str) -> list[str]:
    """Where ``source`` calls ``asyncio.wait_for`` (or imports it by name)."""
    found = []
    for node in ast.walk(parsing.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "wait_for" and \
                isinstance(node.value, ast.Name) and node.value.id == "asyncio":
            found.append(f"{name}:{node.lineno}")
        elif isinstance(node, ast.ImportFrom) and node.module == "asyncio" and \
                any(alias.name == "wait_for" for alias in node.names):
            found.append(f"{name}:{node.lineno}")
    return found


def test_no_asyncio_wait_for_in_the_processes_code() -> None:
    files = sorted(path for folder in ("app", "topics", "projections") for path in (ROOT / folder).rglob("*.py"))
    assert len(files) > 50
    assert [hit for path in files for hit in wait_fors(path.read_text(), path.relative_to(ROOT).as_posix())] == []


def test_the_scan_finds_asyncio_wait_for_however_it_is_reached() -> None:
    source = "import asyncio\nfrom asyncio import wait_for\nasync def f(x):\n    await asyncio.wait_for(x, 1)\n" \
             "    await within(x, 1)\n    await consumer.wait_for(x)\n"
    assert wait_fors(source, "m.py") == ["m.py:2", "m.py:4"]


def test_a_task_beside_the_main_loop_that_swallows_its_cancellation_still_ends_at_the_stop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "CLEANUP_GRACE_S", 0.1)

    async def scenario() -> tuple[int, bool]:
        swallowed = 0

        async def stubborn() -> None:
            nonlocal swallowed
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    swallowed += 1
                    if swallowed > 1:
                        raise

        async with contextlib.AsyncExitStack() as started:
            beside(started, stubborn())
            await asyncio.sleep(0)
        return swallowed, True

    assert asyncio.run(within(scenario(), 10)) == (2, True)


class _Stopping:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True
        if self.error is not None:
            raise self.error

    async def close(self) -> None:
        self.stopped = True


def test_a_sinks_pool_closes_when_its_consumers_stop_raises_cancelled_error() -> None:
    sink = PgSink(Settings.from_env(DEV_DEFAULTS), "projector", "orderly.decisions", apply=None)  # type: ignore[arg-type]
    consumer, pool = _Stopping(asyncio.CancelledError()), _Stopping()
    sink.consumer, sink.pool = consumer, pool  # type: ignore[assignment]
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(sink.stop())
    assert consumer.stopped and pool.stopped


def test_sigusr1_logs_where_every_task_waits(caplog: pytest.LogCaptureFixture) -> None:
    async def parked_in_a_named_wait() -> None:
        await asyncio.sleep(10)

    async def scenario() -> None:
        task = asyncio.ensure_future(parked_in_a_named_wait())
        await asyncio.sleep(0)
        dump_tasks()
        task.cancel()

    with caplog.at_level(logging.WARNING, logger="orderly.process"):
        asyncio.run(scenario())
    dumped = "\n".join(r.getMessage() for r in caplog.records)
    assert "parked_in_a_named_wait" in dumped and "scenario" in dumped


def test_until_terminated_logs_tasks_on_sigusr1_and_ignores_it_afterwards(caplog: pytest.LogCaptureFixture) -> None:
    async def main_loop() -> None:
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.sleep(0.2)  # the handler runs in the loop

    previous = signal.getsignal(signal.SIGUSR1)
    try:
        with caplog.at_level(logging.WARNING, logger="orderly.process"):
            asyncio.run(until_terminated(main_loop()))
        after = signal.getsignal(signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert "main_loop" in "\n".join(r.getMessage() for r in caplog.records)
    assert after == signal.SIG_IGN  # a late USR1 while the process exits does not end it early


def test_a_task_beside_the_main_loop_cleans_up_in_peace_within_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer leaving its group takes a moment: its cleanup is not cancelled again meanwhile."""
    monkeypatch.setattr(metrics, "CANCEL_AGAIN_S", 0.01)
    cleaned: list[str] = []

    async def consumer() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.2)  # leaving the group: twenty times CANCEL_AGAIN_S
            cleaned.append("left")

    async def scenario() -> None:
        async with contextlib.AsyncExitStack() as started:
            beside(started, consumer())
            await asyncio.sleep(0)

    asyncio.run(within(scenario(), 10))
    assert cleaned == ["left"]
