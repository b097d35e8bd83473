"""app/deadlines.py's Deadlines: one timer for every append in flight fails exactly the appends whose
deadline has passed (their delivery future, or their task while it still waits in the producer),
never one early, never one that already finished."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from app.deadlines import Deadlines, Pending
from app.ingest.answers import Unavailable
from app.ingest.appender import Appender
from app.metrics import IngestMetrics

OPS = st.lists(st.one_of(
    st.tuples(st.just("watch"), st.floats(0, 3)),  # a new append, started this much after the last
    st.tuples(st.just("finish"), st.integers(0, 50)),  # the append with this index is acknowledged
    st.tuples(st.just("tick"), st.floats(0, 3)),  # the timer runs this much later
), max_size=60)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_exactly_the_late_ones_fail(ops: list[tuple[str, float]]) -> None:
    async def scenario() -> None:
        deadlines = Deadlines(timeout_s=2.0)
        loop = asyncio.get_running_loop()
        started: list[tuple[float, Pending]] = []
        failed_so_far = 0
        clock = 0.0
        for op, value in ops:
            if op == "watch":
                clock += value
                pending = deadlines.watch(clock)
                pending.delivered = loop.create_future()
                started.append((clock, pending))
            elif op == "finish" and started:
                _, pending = started[int(value) % len(started)]
                assert pending.delivered is not None
                if not pending.delivered.done():
                    pending.delivered.set_result(1)
                    pending.finished = True
            elif op == "tick":
                clock += value
                failed_so_far += deadlines.expire(clock)
                timed_out = 0
                for start, pending in started:
                    future = pending.delivered
                    assert future is not None
                    if future.done() and future.exception() is not None:
                        assert isinstance(future.exception(), TimeoutError) and start + 2.0 <= clock
                        assert pending.expired
                        timed_out += 1
                    elif not future.done():
                        assert start + 2.0 > clock  # nothing late is left pending after a tick
                    else:
                        assert future.result() == 1 and not pending.expired  # finished keeps its ack
                assert timed_out == failed_so_far
                assert len(deadlines._pending) <= sum(1 for _, p in started if not p.finished) + len(started)

    asyncio.run(scenario())


def test_an_append_still_waiting_in_the_producer_is_cancelled_at_its_deadline() -> None:
    async def scenario() -> None:
        deadlines = Deadlines(timeout_s=0.1, tick_s=0.01)
        loop = asyncio.get_running_loop()
        runner = asyncio.create_task(deadlines.run())
        never = asyncio.Event()
        on_time: asyncio.Future[int] = loop.create_future()

        async def stuck() -> None:
            deadlines.watch(loop.time(), asyncio.current_task())
            await never.wait()  # as aiokafka's send waits for room in a full buffer

        waiting = asyncio.create_task(stuck())
        deadlines.watch(loop.time()).delivered = on_time
        on_time.set_result(7)
        try:
            async with asyncio.timeout(2):
                try:
                    await waiting
                except asyncio.CancelledError:
                    pass
                else:
                    raise AssertionError("the stuck append was not cancelled")
        finally:
            runner.cancel()
        assert on_time.result() == 7 and not deadlines._pending

    asyncio.run(scenario())


class _FullBuffer:
    """A producer whose buffer is full: ``send`` waits until it is cancelled."""

    async def send(self, *args: object) -> asyncio.Future[object]:
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable")


def _appended(outside_too: bool) -> str:
    """One append waiting in the producer when its deadline passes (and, ``outside_too``, the
    ingest is stopped in the same turn): what the append raises."""
    async def scenario() -> str:
        appender = Appender("127.0.0.1:9", 0.5, IngestMetrics())
        appender._producer = _FullBuffer()  # type: ignore[assignment]
        appender._expiring = asyncio.ensure_future(asyncio.sleep(3600))  # the timer runs: the deadlines' path
        task = asyncio.ensure_future(appender.append("t", b"k", b"v", []))
        for _ in range(5):
            await asyncio.sleep(0)
        appender.deadlines.expire(asyncio.get_running_loop().time() + 1.0)  # cancels the waiting task
        if outside_too:
            task.cancel()
        try:
            await task
            return "appended"
        except asyncio.CancelledError:
            return "cancelled"
        except Unavailable as exc:
            return f"unavailable: {exc}"
        finally:
            appender._expiring.cancel()

    return asyncio.run(scenario())


def test_a_deadline_is_a_timeout_and_a_stop_in_the_same_turn_stays_a_cancellation() -> None:
    assert _appended(outside_too=False) == "unavailable: kafka append failed: TimeoutError"
    assert _appended(outside_too=True) == "cancelled"
