"""The overview's counts are shared: one count at a time whoever asks, fresh for a second or ten
times what counting took, stale ones answered while a long count runs, a failed count raised to its
readers and tried again, an operator's action makes them stale (app/admin/overview.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.admin.overview import Counted, CountFailed, SharedCounts, StillCounting

EPOCH = datetime(2026, 12, 7, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counter:
    """A count whose result is the number of counts made, taking ``seconds`` of the fake clock and
    ``real_s`` of the loop's time; ``fail`` raises instead."""

    def __init__(self, clock: Clock, seconds: float = 0.01, real_s: float = 0.0) -> None:
        self.clock, self.seconds, self.real_s = clock, seconds, real_s
        self.made = 0
        self.running = 0
        self.most_at_once = 0
        self.fail: Exception | None = None
        self.gate: asyncio.Event | None = None

    async def __call__(self) -> Counted:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            at = EPOCH + timedelta(seconds=self.clock.now)
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(self.real_s)
            self.clock.now += self.seconds
            if self.fail is not None:
                raise self.fail
            self.made += 1
            return Counted({"n": self.made}, at, self.seconds)
        finally:
            self.running -= 1


def shared(counter: Counter, clock: Clock, **kw: Any) -> SharedCounts:
    return SharedCounts(counter, first_wait_s=kw.pop("first_wait_s", 5.0), clock=clock, **kw)


async def test_readers_at_once_share_one_count() -> None:
    clock = Clock()
    counter = Counter(clock, real_s=0.02)
    counts = shared(counter, clock)
    answers = await asyncio.gather(*(counts.read() for _ in range(20)))
    assert counter.made == 1 and counter.most_at_once == 1
    assert {a["n"] for a in answers} == {1} and len({a["counted_at"] for a in answers}) == 1


async def test_counts_stay_fresh_a_second_or_ten_times_what_counting_took() -> None:
    clock = Clock()
    seconds: list[float] = []
    counter = Counter(clock, seconds=0.01)
    counts = shared(counter, clock, took=seconds.append)
    assert (await counts.read())["n"] == 1
    clock.now += 0.9
    assert (await counts.read())["n"] == 1  # within a second: as they were
    clock.now += 0.2
    assert (await counts.read())["n"] == 2  # past it: counted again
    assert seconds == [pytest.approx(0.01), pytest.approx(0.01)]

    counter.seconds = 3.0  # a large history: fresh for 30 s after it
    clock.now += 2
    third = await counts.read()
    assert third["n"] == 3 and third["counting_s"] == 3.0
    clock.now += 29
    assert (await counts.read())["n"] == 3
    clock.now += 2
    assert (await counts.read())["n"] == 4


async def test_a_long_count_answers_the_last_counts_and_goes_on_for_the_next_reader() -> None:
    clock = Clock()
    counter = Counter(clock)
    counts = shared(counter, clock, wait_s=0.05)
    first = await counts.read()
    clock.now += 2
    counter.gate = asyncio.Event()  # the next count does not finish until let go
    assert await counts.read() is first  # waited wait_s, then the last counts
    assert counter.running == 1
    counter.gate.set()
    await asyncio.sleep(0.01)
    assert (await counts.read())["n"] == 2 and counter.made == 2  # the same count, not a new one


async def test_no_counts_yet_and_a_count_past_the_deadline_is_still_counting_not_cancelled() -> None:
    clock = Clock()
    counter = Counter(clock)
    counter.gate = asyncio.Event()
    counts = shared(counter, clock, first_wait_s=0.05)
    with pytest.raises(StillCounting, match="being read from PostgreSQL"):
        await counts.read()
    reader = asyncio.create_task(counts.read())
    await asyncio.sleep(0.01)
    reader.cancel()  # a reader that goes away (a closed tab) leaves the count to the others
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert counter.running == 1
    counter.gate.set()
    assert (await counts.read())["n"] == 1 and counter.made == 1


async def test_a_failed_count_is_told_to_its_readers_and_tried_again_after_a_back_off() -> None:
    clock = Clock()
    counter = Counter(clock)
    failures: list[BaseException] = []
    counts = shared(counter, clock, failed=failures.append)
    counter.fail = OSError("PostgreSQL away")
    results = await asyncio.gather(counts.read(), counts.read(), return_exceptions=True)
    assert all(isinstance(r, CountFailed) and "(OSError; the admin's log says more)" in str(r) for r in results)
    assert "PostgreSQL away" not in str(results[0])  # an error's text can name a host or a user: only the log has it
    assert len(failures) == 1
    with pytest.raises(CountFailed, match=r"OSError; the admin's log says more\); trying again in 1 s"):
        await counts.read()  # backing off: no count started
    assert len(failures) == 1
    clock.now += 1.0
    with pytest.raises(CountFailed):
        await counts.read()
    assert len(failures) == 2
    clock.now += 1.5  # the back-off doubled: 2 s
    with pytest.raises(CountFailed):
        await counts.read()
    assert len(failures) == 2
    clock.now += 0.5
    counter.fail = None
    assert (await counts.read())["n"] == 1 and len(failures) == 2


async def test_stale_counts_whose_refresh_fails_are_answered_with_why() -> None:
    clock = Clock()
    counter = Counter(clock)
    counts = shared(counter, clock)
    first = await counts.read()
    assert first["count_error"] is None
    clock.now += 2
    counter.fail = OSError("PostgreSQL away")
    waited = await counts.read()  # the reader waiting for it: the last counts, and why they are not newer
    later = await counts.read()  # backing off: the same
    for answer in (waited, later):
        assert answer["n"] == 1 and answer["counted_at"] == first["counted_at"]
        assert answer["count_error"] == "OSError; the admin's log says more"


async def test_a_count_failing_with_a_timeout_of_its_own_is_a_failure_not_still_counting() -> None:
    clock = Clock()
    counter = Counter(clock)
    counts = shared(counter, clock, first_wait_s=0.05)
    counter.fail = TimeoutError()  # asyncpg's pool or statement deadline
    with pytest.raises(CountFailed, match="TimeoutError"):
        await counts.read()
    counter.fail = None
    clock.now += 1
    await counts.read()
    clock.now += 2
    counter.fail = TimeoutError()
    assert (await counts.read())["count_error"].startswith("TimeoutError")  # not as if the wait ran out


async def test_an_action_makes_the_counts_stale_even_one_being_counted() -> None:
    clock = Clock()
    counter = Counter(clock)
    counts = shared(counter, clock)
    assert (await counts.read())["n"] == 1
    clock.now += 0.01  # what the action took
    counts.stale()
    assert (await counts.read())["n"] == 2  # within the second, counted again

    clock.now += 2
    counter.gate = asyncio.Event()
    reading = asyncio.create_task(counts.read())
    await asyncio.sleep(0.01)
    counts.stale()  # during a count that began before the action
    joining = asyncio.create_task(counts.read())  # the page the operator lands on after it
    await asyncio.sleep(0.01)
    counter.gate.set()
    assert (await reading)["n"] == 4 and (await joining)["n"] == 4  # counted once more, after the action
    counter.gate = None
    assert (await counts.read())["n"] == 4 and counter.made == 4  # and fresh


async def test_actions_one_after_another_count_at_most_half_the_time() -> None:
    clock = Clock()
    counter = Counter(clock, seconds=3.0)
    counts = shared(counter, clock)
    await counts.read()
    counts.stale()
    assert (await counts.read())["n"] == 1  # within 3 s of a 3 s count: not again yet
    clock.now += 3
    assert (await counts.read())["n"] == 2

    clock.now += 40
    counter.gate = asyncio.Event()
    reading = asyncio.create_task(counts.read())
    await asyncio.sleep(0.01)
    counts.stale()  # during the count: it counts twice, 6 s in all
    counter.gate.set()
    assert (await reading)["n"] == 4
    counter.gate = None
    counts.stale()
    clock.now += 5
    assert (await counts.read())["n"] == 4  # within the 6 s both took
    clock.now += 1
    assert (await counts.read())["n"] == 5


async def test_a_long_count_after_a_failure_answers_the_last_counts_with_why() -> None:
    clock = Clock()
    counter = Counter(clock)
    counts = shared(counter, clock, wait_s=0.02)
    await counts.read()
    clock.now += 2
    counter.fail = OSError("PostgreSQL away")
    assert (await counts.read())["count_error"] is not None
    clock.now += 1
    counter.fail, counter.gate = None, asyncio.Event()  # the retry hangs (a pool's connection awaited)
    answer = await counts.read()
    assert answer["n"] == 1 and answer["count_error"] == "OSError; the admin's log says more"
    counter.gate.set()
    await asyncio.sleep(0.01)
    assert (await counts.read())["count_error"] is None


async def test_an_action_of_another_admin_or_a_command_found_in_the_audit_makes_them_stale() -> None:
    clock = Clock()
    counter = Counter(clock, seconds=0.5)  # fresh for 5 s
    last: list[datetime | None] = [None]
    asked: list[float] = []
    away = [False]

    async def changed() -> datetime | None:
        asked.append(clock.now)
        if away[0]:
            raise OSError("PostgreSQL away")
        return last[0]

    counts = shared(counter, clock, changed=changed)
    first = await counts.read()
    clock.now += 0.1
    assert (await counts.read())["n"] == 1  # nothing in the audit
    last[0] = first["counted_at"] + timedelta(seconds=0.05)
    assert (await counts.read())["n"] == 1  # the audit asked at most once a second
    clock.now += 1
    assert (await counts.read())["n"] == 2  # an action after the count began
    clock.now += 1.1
    last[0] = first["counted_at"]  # one before the next count began
    assert (await counts.read())["n"] == 2
    clock.now += 1.1
    away[0] = True  # PostgreSQL away: the fresh counts stand
    assert (await counts.read())["n"] == 2
    assert len(asked) == 4


async def test_closing_cancels_a_count_under_way() -> None:
    clock = Clock()
    counter = Counter(clock)
    counter.gate = asyncio.Event()
    counts = shared(counter, clock, first_wait_s=0.02)
    with pytest.raises(StillCounting):
        await counts.read()
    await counts.close()
    assert counter.running == 0 and counts._running is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 3), st.integers(1, 4), st.floats(0, 0.004), st.booleans()),
                min_size=1, max_size=12))
def test_never_two_counts_at_once_and_never_a_count_while_fresh(steps: list[tuple[float, int, float, bool]]) -> None:
    """Property: whatever the readers' timing, the counts' durations and the actions between them,
    one count runs at a time, and a read within the fresh window starts none."""

    async def run() -> None:
        clock = Clock()
        counter = Counter(clock)
        counts = shared(counter, clock, wait_s=0.002)
        for advance, readers, real_s, act in steps:
            clock.now += advance
            counter.real_s = real_s
            fresh = counts.value is not None and clock.now < counts.fresh_until and counts._running is None
            before = counter.made
            answers = await asyncio.gather(*(counts.read() for _ in range(readers)))
            assert counter.most_at_once == 1
            if fresh:
                assert counter.made == before and all(a is answers[0] for a in answers)
            if act:
                counts.stale()
        await asyncio.sleep(0.01)  # let a count still running end

    asyncio.run(run())


async def test_a_recount_after_an_action_that_fails_keeps_what_the_count_before_it_read() -> None:
    """The count an action came during is newer than the last counts: when counting again fails,
    it is what readers get (not fresh: with why), not the counts from before it."""
    clock = Clock()
    made: list[int] = []

    async def count() -> Counted:
        made.append(len(made) + 1)
        at = EPOCH + timedelta(seconds=clock.now)
        if len(made) == 2:
            counts.stale()  # an operator's action while the second count reads
        if len(made) == 3:
            raise OSError("PostgreSQL away")
        return Counted({"n": made[-1]}, at, 0.01)

    took: list[float] = []
    counts = SharedCounts(count, first_wait_s=5.0, clock=clock, took=took.append)
    assert (await counts.read())["n"] == 1
    clock.now += 2
    answer = await counts.read()  # counted (n=2), counted again after the action: failed
    assert made == [1, 2, 3] and took == [0.01, 0.01]
    assert answer["n"] == 2 and answer["count_error"] == "OSError; the admin's log says more"
    assert answer["counted_at"] == EPOCH + timedelta(seconds=102)  # the second count's, not the first's
    later = await counts.read()  # backing off: the same, still with why
    assert (later["n"], later["count_error"]) == (2, answer["count_error"]) and made == [1, 2, 3]
