"""The worker's source records a fetch at a time (app/seams/faust/handover.py) on Faust's real app,
consumer bookkeeping and flow control: every record decided once and in order, never more than a
batch, tracked as unacked from its take to its ack (Faust's revocation waits on that), dropped as a
stream drops it when the flow stops or the generation changes, and the fetch loop's hand-over of a
fetch as _hand_over's of a record."""

from __future__ import annotations

import asyncio
import random
import time
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP
from faust.types.tuples import Message

from app.seams.faust import Consumer, Handover, Taken
from app.worker.takes import decide_takes
from tests.unit.test_worker_flow import TP0, _message, _setup

BATCH_MAX = 64


def _msg(offset: int, generation: int) -> Message:
    return Message("raw", 0, offset, 0.0, 0, [], b"pg:dep_1", b"{}", None, tp=TP0, generation_id=generation)


def _handover(generation: int = 1) -> tuple[Any, Handover]:
    app, _, _ = _setup()
    app.consumer_generation_id = generation
    app.flow_control.resume()
    return app, Handover(app, "raw")


def test_every_record_once_in_order_no_take_above_the_maximum_all_acked_on_a_crowded_loop() -> None:
    async def once(seed: int, count: int = 3000) -> None:
        rnd = random.Random(seed)
        app, handover = _handover()
        decided: list[int] = []
        sizes: list[int] = []
        unacked = app.consumer._unacked_messages

        async def decide(taken: list[Taken]) -> None:
            sizes.append(len(taken))
            assert all(item.message in unacked for item in taken)  # tracked while decided
            await asyncio.sleep(rnd.choice([0, 0.001, 0.03, 0.08]))
            decided.extend(item.message.offset for item in taken)
            handover.ack(taken)

        async def feed() -> None:
            offset = 0
            while offset < count:
                size = min(rnd.choice([1, 2, 7, 50, 200]), count - offset)
                await handover.put([_message(o) for o in range(offset, offset + size)])
                offset += size
                if rnd.random() < 0.1:
                    await asyncio.sleep(rnd.choice([0, 0.01, 0.06]))

        async def crowd() -> None:
            while True:
                await asyncio.sleep(0)

        crowds = [asyncio.ensure_future(crowd()) for _ in range(10)]
        feeding = asyncio.ensure_future(feed())
        loop = asyncio.ensure_future(decide_takes(handover.takes(BATCH_MAX, within=0.02), decide, handover.queued,
                                                  lambda: True, BATCH_MAX))
        try:
            deadline = time.monotonic() + 60
            while len(decided) < count and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            loop.cancel()
            for task in (*crowds, feeding):
                task.cancel()
            await asyncio.gather(loop, feeding, *crowds, return_exceptions=True)
        assert decided == list(range(count))
        assert max(sizes) <= BATCH_MAX
        assert not unacked
        assert TP0 in app.consumer._acked  # the partition has news for Faust's commit
        assert TP0 in app.monitor.stream_inbound_time  # Faust's stalled-stream check sees it read
        assert app.consumer._n_acked == count

    async def main() -> None:
        for seed in range(3):
            await once(seed)

    asyncio.run(main())


def test_a_take_waits_within_for_more_and_carries_what_is_over_the_maximum() -> None:
    async def run() -> None:
        _, handover = _handover()
        takes = handover.takes(5, within=0.05)
        handover.put_nowait([_message(0), _message(1)])
        first = asyncio.ensure_future(takes.__anext__())
        await asyncio.sleep(0.01)
        assert not first.done()  # short: waits for more within 0.05 s
        handover.put_nowait([_message(o) for o in range(2, 9)])
        assert [t.message.offset for t in await first] == [0, 1, 2, 3, 4]
        assert handover.queued() == 4  # carried to the next take
        assert [t.message.offset for t in await takes.__anext__()] == [5, 6, 7, 8]
        assert handover.queued() == 0

    asyncio.run(run())


@pytest.mark.parametrize("change", ["flow_stopped", "generation"])
def test_records_a_stream_would_skip_are_dropped_untracked(change: str) -> None:
    async def run() -> None:
        app, handover = _handover()
        takes = handover.takes(10, within=0.05)
        handover.put_nowait([_message(0), _message(1)])
        first = asyncio.ensure_future(takes.__anext__())
        await asyncio.sleep(0.01)  # taken off the queue, waiting for more: not yet tracked
        if change == "flow_stopped":
            app.flow_control.suspend()  # a rebalance began
        else:
            app.consumer_generation_id = 2  # one ended
        handover.put_nowait([_message(2)])
        await asyncio.sleep(0.1)
        assert not first.done()  # nothing to hand over: the take goes on
        assert not app.consumer._unacked_messages
        if change == "flow_stopped":
            app.flow_control.resume()  # back from the suspension: the queue was cleared
            assert handover.queued() == 0
            handover.put_nowait([_message(3)])
        else:
            handover.put_nowait([_message(3), _msg(4, 2)])
        assert [t.message.offset for t in await first] == ([3] if change == "flow_stopped" else [4])
        first.cancel()

    asyncio.run(run())


def test_a_suspension_clears_queued_fetches_with_the_stream_queues() -> None:
    async def run() -> None:
        app, handover = _handover()
        handover.put_nowait([_message(0)])
        assert handover.queue in app.flow_control._queues
        app.flow_control.suspend()
        app.flow_control.resume()
        assert handover.queued() == 0 and handover.queue.empty()

    asyncio.run(run())


def _fetch_loop(app: Any) -> Any:
    """The seam consumer's state its fetch-loop steps read, on a stand-in."""
    return SimpleNamespace(app=app, _read_offset={}, _rewound={}, _fetches=1, _commit_every=None, _n_acked=0,
                           suspend_flow=asyncio.Event(), wait_first=None)


def test_a_fetch_is_admitted_as_records_are_and_its_read_offsets_move_once_handed_over() -> None:
    async def run() -> None:
        app, handover = _handover()
        consumer = _fetch_loop(app)
        consumer._read_offset[TP0] = 4  # handed over up to 4 before
        reads: dict[TP, int] = {}
        admitted = [m.offset for m in map(_message, [3, 4, 5, 6]) if Consumer._admit(consumer, TP0, m, reads)]
        assert admitted == [4, 5, 6]  # as _hand_over: below the read offset is dropped
        assert consumer._read_offset[TP0] == 4  # not yet: only once handed over
        await Consumer._hand_over_fetch(consumer, handover, [_message(o) for o in admitted], reads)
        assert consumer._read_offset[TP0] == 6
        assert [m.offset for m in handover.queue.get_nowait()] == [4, 5, 6]

        # rewound to 2 (the worker found 2-3 skipped): records fetched before the seek are dropped
        # until the one rewound to comes, and the read offset is left to the rewind
        consumer._read_offset[TP0], consumer._rewound[TP0] = 2, (2, 1)
        reads = {}
        assert not Consumer._admit(consumer, TP0, _message(7), reads)
        assert Consumer._admit(consumer, TP0, _message(2), reads) and TP0 not in consumer._rewound

    asyncio.run(run())


def test_a_fetch_handed_over_while_the_flow_stops_is_dropped() -> None:
    async def run() -> None:
        app, handover = _handover()
        consumer = _fetch_loop(app)

        async def wait_first(*coros: Any) -> None:
            tasks = [asyncio.ensure_future(c) for c in coros]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        consumer.wait_first = wait_first
        app.flow_control.suspend()
        handing = asyncio.ensure_future(Consumer._hand_over_fetch(consumer, handover, [_message(0)], {TP0: 0}))
        await asyncio.sleep(0.05)
        assert not handing.done()  # waits for the flow, as the conductor's callback does
        consumer.suspend_flow.set()  # the rebalance: given up
        await asyncio.wait_for(handing, 1)
        app.flow_control.resume()
        assert handover.queued() == 0

    asyncio.run(run())


def test_a_record_that_comes_to_an_idle_worker_after_the_window_goes_at_once() -> None:
    async def run() -> None:
        _, handover = _handover()
        takes = handover.takes(5, within=0.5)
        first = asyncio.ensure_future(takes.__anext__())
        await asyncio.sleep(0.6)  # idle longer than the window since the take began
        handover.put_nowait([_message(0)])
        await asyncio.sleep(0.1)
        assert first.done()  # not held for another window of 0.5 s
        assert [t.message.offset for t in first.result()] == [0]

    asyncio.run(run())
