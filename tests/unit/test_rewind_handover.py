"""The worker's rewind of a partition (app.seams.faust.consumer.Consumer.rewind) against its fetch
loop's hand-over (Consumer._hand_over): records fetched before the seek and handed over after it,
or a hand-over awaiting the conductor while the rewind lands, must not move the read offset past
the records the seek fetches again (Faust's own seek to the committed offsets loses records that
way: app/worker/exits.py OffsetGuard). Otherwise the records fetched again are dropped as read,
and the worker rewinds again and again."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st

from app.seams.faust.consumer import Consumer

TP0 = TP("ns.raw", 0)


class _Kafka:
    """aiokafka's consumer: where it was sought to."""

    def __init__(self) -> None:
        self.sought: list[int] = []
        self.started: list[Any] = []  # partitions sought to their earliest offset

    def seek(self, tp: Any, offset: int) -> None:
        self.sought.append(offset)

    async def seek_to_beginning(self, *tps: Any) -> None:
        self.started.extend((tp.topic, tp.partition) for tp in tps)


class _Thread:
    def __init__(self, kafka: _Kafka) -> None:
        self.kafka = kafka

    def _ensure_consumer(self) -> _Kafka:
        return self.kafka

    async def call_thread(self, fun: Any, *args: Any) -> Any:
        await asyncio.sleep(0)  # the consumer thread runs it later: the fetch loop may run meanwhile
        return await fun(*args)


class _Fake:
    """What rewind and _hand_over use of the consumer."""

    def __init__(self, read: int) -> None:
        self._read_offset: dict[TP, int | None] = {TP0: read}
        self._rewound: dict[TP, tuple[int, int | None]] = {}
        self._fetches = 1  # the fetch loop's: the one under way
        self._commit_every = None
        self._n_acked = 0
        self._thread = _Thread(_Kafka())
        self.log = SimpleNamespace(warning=lambda *a: None)
        self.delivered: list[int] = []
        self.during: Any = None  # run while the next hand-over awaits the conductor

    def delivers_at_once(self, tp: TP) -> bool:
        return True

    async def _add_gap(self, tp: TP, start: int, end: int) -> None:
        pass

    async def rewind(self, tp: TP, offset: int) -> bool:
        return await Consumer.rewind(self, tp, offset)  # type: ignore[arg-type]

    async def hand_over(self, offset: int) -> None:
        async def callback(message: Any) -> None:
            if self.during is not None:
                during, self.during = self.during, None
                await during
            self.delivered.append(message.offset)

        await Consumer._hand_over(self, TP0, SimpleNamespace(offset=offset, topic=TP0.topic),  # type: ignore[arg-type]
                                   self._read_offset.get(TP0), callback, lambda topic: True)


def test_a_rewind_landing_during_a_hand_over_is_not_undone_by_it() -> None:
    """0-9 handed over, but 5-8 never reached the worker: it rewinds to 5 while the fetch loop waits
    to hand over 10 (fetched before the seek), then hands over 11 of the same fetch, then what the
    seek fetched again. The worker must get 5 onwards in order, and nothing past 5 before it."""
    fake = _Fake(read=9)

    async def run() -> None:
        fake.during = fake.rewind(TP0, 5)
        await fake.hand_over(10)  # the rewind lands while this one waits for the conductor
        await fake.hand_over(11)  # the rest of the old fetch
        fake._fetches += 1  # then the new one, from 5
        for offset in range(5, 13):
            await fake.hand_over(offset)

    asyncio.run(run())
    assert fake._thread.kafka.sought == [5]
    after = fake.delivered[1:]  # 10 was on its way before the rewind
    assert after == list(range(5, 13)), after
    assert fake._read_offset[TP0] == 12


def test_stale_records_after_a_rewind_are_dropped_until_the_record_sought_to() -> None:
    fake = _Fake(read=9)

    async def run() -> None:
        assert await fake.rewind(TP0, 5)
        for offset in (10, 11):
            await fake.hand_over(offset)
        fake._fetches += 1
        for offset in (5, 6, 7):
            await fake.hand_over(offset)

    asyncio.run(run())
    assert fake.delivered == [5, 6, 7]


def test_a_fetch_after_the_seek_is_handed_over_wherever_it_starts() -> None:
    """The broker reset the partition past the offset rewound to (retention deleted it meanwhile):
    what the fetches after the seek bring is handed over (the worker's guard sees retention), not
    dropped while waiting for a record that no longer exists."""
    fake = _Fake(read=9)

    async def run() -> None:
        assert await fake.rewind(TP0, 5)
        await fake.hand_over(10)  # fetched before the seek
        fake._fetches += 1
        for offset in (8, 9, 10):
            await fake.hand_over(offset)

    asyncio.run(run())
    assert fake.delivered == [8, 9, 10]


def test_a_seek_of_faust_after_a_rewind_stands_and_nothing_stalls() -> None:
    """Faust seeks to the committed offsets (perform_seek, on an assignment or while the flow is off)
    or drops the read offset (a revocation) after the worker's rewind: its seek stands, the records
    from there are handed over (the worker's guard acks those handed over before)."""
    fake = _Fake(read=9)

    async def run() -> None:
        assert await fake.rewind(TP0, 5)
        fake._read_offset[TP0] = 3  # Consumer.perform_seek: read offsets set to the committed ones
        for offset in (3, 4, 5, 6):
            await fake.hand_over(offset)
        assert await fake.rewind(TP0, 0)  # from the partition's start: no read offset (Faust's None)
        for offset in (0, 1):
            await fake.hand_over(offset)
        assert await fake.rewind(TP0, 7)
        fake._read_offset.pop(TP0)  # Consumer.on_partitions_revoked, then assigned again
        for offset in (2, 3):
            await fake.hand_over(offset)

    asyncio.run(run())
    assert fake.delivered == [3, 4, 5, 6, 0, 1, 2, 3]


@given(st.integers(0, 20), st.integers(0, 10), st.integers(0, 40), st.integers(0, 12), st.integers(1, 15))
def test_after_a_rewind_the_worker_gets_the_records_from_where_it_rewound_in_order(
        to: int, ahead: int, first: int, n: int, again: int) -> None:
    """Whatever the fetch loop still holds from before the seek (a run of records of the partition,
    orderly.raw having no holes, from anywhere), the worker gets
    ``to`` first and never a record past the next it expects (a skip), so it need not rewind again;
    one it had before may come again (the record at ``to`` fetched before the seek: it acks it)."""
    fake = _Fake(read=to + ahead)

    async def run() -> None:
        assert await fake.rewind(TP0, to)
        for offset in range(first, first + n):
            await fake.hand_over(offset)
        fake._fetches += 1
        for offset in range(to, to + again):
            await fake.hand_over(offset)

    asyncio.run(run())
    assert fake.delivered[:1] == [to]
    expected = to
    for offset in fake.delivered:
        assert offset <= expected, fake.delivered  # beyond it: records skipped
        expected = max(expected, offset + 1)
    assert expected >= to + again  # nothing the seek fetched again was dropped unseen


def test_faust_seeking_to_the_committed_offsets_supersedes_a_rewind() -> None:
    """A rewind to 0 (a new group), then Faust's seek to the committed offsets at an assignment with
    none committed (its read offset None, as the rewind's) and the records from the partition's
    earliest, 4 (retention): they are handed over, not waited past for 0 forever."""
    consumer = object.__new__(Consumer)
    fake = _Fake(read=9)
    consumer.__dict__.update(vars(fake))  # the same read offsets and rewinds as the fake's
    consumer.__dict__["_committed_offset"] = {}
    consumer.__dict__["_resumed"] = asyncio.Event()

    async def seek_to_committed() -> dict[TP, int | None]:
        return {TP0: None}

    consumer.__dict__["seek_to_committed"] = seek_to_committed
    consumer.__dict__["app"] = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda topic: True))
    consumer.__dict__["assignment"] = lambda: {TP0}

    async def run() -> None:
        assert await Consumer.rewind(consumer, TP0, 0)
        await consumer.perform_seek()
        for offset in (4, 5):
            await fake.hand_over(offset)

    asyncio.run(run())
    assert fake.delivered == [4, 5]


def test_faust_s_seek_starts_over_a_partition_never_committed_and_leaves_the_others() -> None:
    """aiokafka's seek_to_committed seeks only partitions committed above 0: one never committed
    stayed where its fetch got to, and the records Faust fetched there and dropped at a rebalance
    never came again (a worker taking over a dead one's partition waited for the next record to
    notice). Such a partition is sought to its earliest offset: an agent's, not a changelog (nor the
    assignor's leader topic, whose reset waited for a leader away) nor a committed one."""
    consumer = object.__new__(Consumer)
    kafka = _Kafka()
    committed, fresh, zero, changelog = TP("ns.raw", 1), TP("ns.raw", 2), TP("ns.raw", 3), TP("ns-changelog", 0)
    consumer.__dict__.update(_rewound={}, _read_offset={fresh: 7, committed: 5}, _thread=_Thread(kafka),
                             _resumed=asyncio.Event(),
                             _committed_offset={committed: 5, zero: None},
                             app=SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda t: t == "ns.raw")),
                             assignment=lambda: {committed, fresh, zero, changelog})

    async def seek_to_committed() -> dict[TP, int | None]:
        return {committed: 5, fresh: None, zero: 0, changelog: None}

    consumer.__dict__["seek_to_committed"] = seek_to_committed
    asyncio.run(consumer.perform_seek())
    assert sorted(kafka.started) == [("ns.raw", 2), ("ns.raw", 3)]
    assert consumer._read_offset[fresh] is None and consumer._read_offset[committed] == 5
    assert consumer._resumed.is_set()  # the fetch loop, waiting with every partition paused, may read them now


def test_the_seek_to_the_start_waits_for_the_broker_a_bounded_time() -> None:
    """A partition without a leader delays aiokafka's reset (it asks again and again): the consumer
    thread, whose fetches wait behind the seek, is not held past the bound; the reset goes on."""
    from app.seams.faust.consumer import seek_to_start

    class _Away:
        async def seek_to_beginning(self, *tps: Any) -> None:
            await asyncio.sleep(60)

    async def run() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await seek_to_start(_Away(), [TP0], timeout_s=0.05)
        return loop.time() - started

    assert asyncio.run(run()) < 5
