"""The worker's fetch loop hand-over (app.seams.faust.consumer.Consumer.delivers_at_once, _hand_over):
a record goes straight to the conductor only when nothing can make that wait (the flow runs, no
subscription change holds the conductor, the producer buffer is under its limit, no queue of the
partition is full); otherwise it races the flow's suspension as in Faust, so a rebalance that
clears the queues never receives a record of a revoked partition afterwards. Records below the
read offset are dropped, a jump in offsets is a gap, and the read offset follows each record."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st

from app.seams.faust.consumer import Consumer

TP0 = TP("ns.raw", 0)


def _consumer(suspended: bool = False, flow_active: bool = True, locked: bool = False, buffered: int = 0,
              full: tuple[bool, ...] = (False,)) -> Any:
    channels = [SimpleNamespace(queue=SimpleNamespace(full=lambda f=f: f)) for f in full]
    conductor = SimpleNamespace(_tp_to_callback_lock=SimpleNamespace(locked=lambda: locked), _tp_index={TP0: channels})
    app = SimpleNamespace(topics=conductor, flow_control=SimpleNamespace(is_active=lambda: flow_active),
                          producer=SimpleNamespace(buffer=SimpleNamespace(size=buffered, max_messages=100)))
    return SimpleNamespace(app=app, suspend_flow=SimpleNamespace(is_set=lambda: suspended))


@given(st.booleans(), st.booleans(), st.booleans(), st.integers(0, 200), st.lists(st.booleans(), max_size=4))
def test_a_record_is_handed_over_directly_only_when_nothing_can_make_it_wait(
        suspended: bool, flow_active: bool, locked: bool, buffered: int, full: list[bool]) -> None:
    consumer = _consumer(suspended, flow_active, locked, buffered, tuple(full))
    expected = not suspended and flow_active and not locked and buffered <= 100 and not any(full)
    assert Consumer.delivers_at_once(consumer, TP0) is expected


def test_a_partition_without_channels_is_handed_over_directly() -> None:
    consumer = _consumer(full=())
    assert Consumer.delivers_at_once(consumer, TP("ns.raw", 7)) is True


class _Fake:
    """What _hand_over uses of the consumer, recording what it did."""

    def __init__(self, at_once: bool, commit_every: int | None = None, acked: int = 0) -> None:
        self.at_once = at_once
        self._read_offset: dict[TP, int | None] = {}
        self._rewound: dict[TP, tuple[int, int | None]] = {}
        self._fetches = 0
        self._commit_every = commit_every
        self._n_acked = acked
        self.gaps: list[tuple[TP, int, int]] = []
        self.raced = 0
        self.commits = 0

    def delivers_at_once(self, tp: TP) -> bool:
        return self.at_once

    async def wait_first(self, *coros: Any) -> None:
        self.raced += 1
        first, *rest = coros
        await first
        for other in rest:
            other.close()

    async def _add_gap(self, tp: TP, start: int, end: int) -> None:
        self.gaps.append((tp, start, end))

    async def commit(self) -> None:
        self.commits += 1

    async def hand_over(self, offset: int, delivered: list[int]) -> None:
        async def callback(message: Any) -> None:
            delivered.append(message.offset)

        message = SimpleNamespace(offset=offset, topic=TP0.topic)
        await Consumer._hand_over(self, TP0, message, self._read_offset.get(TP0), callback,  # type: ignore[arg-type]
                                   lambda topic: True)

    def suspend(self) -> Any:
        return asyncio.sleep(3600)


@given(st.lists(st.integers(0, 50), max_size=30), st.booleans())
def test_offsets_are_handed_over_once_in_order_and_gaps_are_recorded(offsets: list[int], at_once: bool) -> None:
    fake = _Fake(at_once)
    fake.suspend_flow = SimpleNamespace(wait=fake.suspend)  # type: ignore[attr-defined]
    delivered: list[int] = []

    async def run() -> None:
        for offset in offsets:
            await fake.hand_over(offset, delivered)

    asyncio.run(run())
    expected, gaps, read = [], [], None
    for offset in offsets:
        if read is not None and offset < read:
            continue
        if read and offset - read > 1:
            gaps.append((TP0, read + 1, offset))
        expected.append(offset)
        read = offset
    assert delivered == expected
    assert fake.gaps == gaps
    assert fake._read_offset.get(TP0) == read
    assert fake.raced == (0 if at_once else len(expected))  # the race only when the hand-over could wait


def test_a_commit_is_made_every_commit_every_acks() -> None:
    fake = _Fake(True, commit_every=10, acked=10)
    fake.suspend_flow = SimpleNamespace(wait=fake.suspend)  # type: ignore[attr-defined]
    delivered: list[int] = []
    asyncio.run(fake.hand_over(5, delivered))
    assert (fake.commits, fake._n_acked, delivered) == (1, 0, [5])
    asyncio.run(fake.hand_over(6, delivered))
    assert fake.commits == 1  # no acks since: no commit


def test_a_hand_over_that_raises_leaves_the_read_offset_where_it_was() -> None:
    fake = _Fake(True)
    fake._read_offset[TP0] = 4

    async def callback(message: Any) -> None:
        raise KeyError(TP0)  # e.g. a partition the conductor has no handler for

    async def run() -> None:
        await Consumer._hand_over(fake, TP0, SimpleNamespace(offset=5, topic=TP0.topic),  # type: ignore[arg-type]
                                   4, callback, lambda topic: True)

    try:
        asyncio.run(run())
    except KeyError:
        pass
    else:
        raise AssertionError("the callback's error must reach the fetch loop")
    assert fake._read_offset[TP0] == 4
