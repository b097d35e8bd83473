"""The worker's flow control (app.seams.mode.FlowControl): a resume clears the stream queues only
when the flow comes back from a suspension. Faust resumes it again once a rebalance's stream
partitions are sought to their committed offsets, with the flow running since the recovery began;
clearing then dropped records handed over in between, and the skip guard restarted the worker."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st
from mode.utils.queues import FlowControlQueue

from app.seams.mode import FlowControl


def _queue(flow: FlowControl, items: list[int]) -> FlowControlQueue[int]:
    queue: FlowControlQueue[int] = FlowControlQueue(flow_control=flow, clear_on_resume=True)
    for item in items:
        queue.put_nowait(item)
    return queue


@given(st.lists(st.sampled_from(["suspend", "resume", "put"]), max_size=30))
def test_queues_are_cleared_exactly_when_a_suspended_flow_resumes(steps: list[str]) -> None:
    async def run() -> None:
        flow = FlowControl()  # starts suspended, as Faust's
        queue = _queue(flow, [])
        expected, active = 0, False
        for step in steps:
            if step == "put":
                queue.put_nowait(expected)
                expected += 1
            elif step == "suspend":
                flow.suspend()
                active = False
            else:
                if not active:
                    expected = 0
                flow.resume()
                active = True
            assert queue.qsize() == expected
            assert flow.is_active() == active

    asyncio.run(run())


def test_the_second_resume_of_a_rebalance_keeps_what_was_handed_over() -> None:
    async def run() -> None:
        flow = FlowControl()
        stale = _queue(flow, [1, 2])  # before the rebalance
        flow.suspend()  # revoked
        flow.resume()  # recovery starts: what the old generation left is dropped
        assert stale.qsize() == 0
        stale.put_nowait(657)  # the new generation's records, fetched while the partitions are sought
        stale.put_nowait(658)
        flow.resume()  # Faust's resume after the seek
        assert [stale.get_nowait(), stale.get_nowait()] == [657, 658]
        waiter = asyncio.ensure_future(flow.acquire())
        await asyncio.sleep(0)
        assert waiter.done()  # a running flow lets the conductor through

    asyncio.run(run())
