"""app/ingest.py's Deadlines: one timer for every append in flight fails exactly the futures whose
deadline has passed, never one early, never one that already finished."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

OPS = st.lists(st.one_of(
    st.tuples(st.just("watch"), st.floats(0, 3)),  # a new append, started this much after the last
    st.tuples(st.just("finish"), st.integers(0, 50)),  # the append with this index is acknowledged
    st.tuples(st.just("tick"), st.floats(0, 3)),  # the timer runs this much later
), max_size=60)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_exactly_the_late_ones_fail(ops: list[tuple[str, float]]) -> None:
    from app.ingest import Deadlines

    async def scenario() -> None:
        deadlines = Deadlines(timeout_s=2.0)
        loop = asyncio.get_running_loop()
        started: list[tuple[float, asyncio.Future[int]]] = []
        clock = 0.0
        for op, value in ops:
            if op == "watch":
                clock += value
                future: asyncio.Future[int] = loop.create_future()
                deadlines.watch(future, clock)
                started.append((clock, future))
            elif op == "finish" and started:
                _, future = started[int(value) % len(started)]
                if not future.done():
                    future.set_result(1)
            elif op == "tick":
                clock += value
                failed = deadlines.expire(clock)
                assert failed == sum(1 for _, f in started if f.done() and f.exception() is not None) - sum(
                    1 for _, f in started if getattr(f, "counted", False))
                for start, f in started:
                    if f.done() and f.exception() is not None:
                        assert isinstance(f.exception(), TimeoutError) and start + 2.0 <= clock
                        f.counted = True  # type: ignore[attr-defined]
                    elif not f.done():
                        assert start + 2.0 > clock  # nothing late is left pending after a tick
                    else:
                        assert f.result() == 1  # a finished append keeps its acknowledgement
                assert len(deadlines._pending) <= sum(1 for _, f in started if not f.done()) + len(started)

    asyncio.run(scenario())


def test_the_timer_task_fails_a_late_append() -> None:
    from app.ingest import Deadlines

    async def scenario() -> None:
        deadlines = Deadlines(timeout_s=0.1, tick_s=0.01)
        loop = asyncio.get_running_loop()
        runner = asyncio.create_task(deadlines.run())
        late: asyncio.Future[int] = loop.create_future()
        on_time: asyncio.Future[int] = loop.create_future()
        deadlines.watch(late, loop.time())
        deadlines.watch(on_time, loop.time())
        on_time.set_result(7)
        try:
            async with asyncio.timeout(2):
                try:
                    await late
                except TimeoutError:
                    pass
                else:
                    raise AssertionError("the late append was not failed")
        finally:
            runner.cancel()
        assert on_time.result() == 7 and not deadlines._pending

    asyncio.run(scenario())
