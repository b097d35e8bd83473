"""The pause between batches of the worker and the sinks (app.core.pacing.busy_pause): only after
a large batch while less than a full batch waits, only until the interval since that batch was
taken has passed, never negative; and when a take cut short is held for the next (hold_take)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.pacing import BUSY_BATCH, HOLD_MAX_S, busy_pause, hold_take
from app.settings import dev_settings

BATCH_MAX = dev_settings({}).worker_batch_max  # the default

sizes = st.integers(min_value=1, max_value=BATCH_MAX)
waiting = st.integers(min_value=0, max_value=5000)
times = st.floats(min_value=0, max_value=1e6, allow_nan=False)
spans = st.floats(min_value=0, max_value=10, allow_nan=False)


@given(sizes, waiting, times, spans, st.floats(min_value=0.001, max_value=1))
def test_the_next_batch_is_taken_one_interval_after_a_large_one(size: int, queued: int, taken: float,
                                                                 elapsed: float, interval: float) -> None:
    pause = busy_pause(size, queued, taken, taken + elapsed, interval, BATCH_MAX)
    # Compared as the function does (now against taken + interval): in floats, taken + elapsed can
    # reach taken + interval while elapsed is still a hair below interval.
    if size < BUSY_BATCH or queued >= BATCH_MAX or taken + elapsed >= taken + interval:
        assert pause == 0.0
    else:
        assert pause > 0
        assert abs((taken + elapsed + pause) - (taken + interval)) < 1e-6  # resumes at taken + interval


def test_low_load_and_a_backlog_never_wait_and_busy_batches_wait_the_rest() -> None:
    assert busy_pause(BUSY_BATCH - 1, 0, 10.0, 10.0, 0.1, BATCH_MAX) == 0.0  # low load: latency first
    assert busy_pause(BATCH_MAX, BATCH_MAX, 10.0, 10.0, 0.1, BATCH_MAX) == 0.0  # a full batch waits already
    assert busy_pause(BUSY_BATCH, 150, 10.0, 10.03, 0.1, BATCH_MAX) == pytest.approx(0.07)


held_for = st.floats(min_value=0, max_value=1, allow_nan=False)


@given(st.integers(min_value=1, max_value=BATCH_MAX), waiting, held_for)
def test_a_short_take_is_held_only_while_a_backlog_waits_and_not_for_long(held: int, queued: int,
                                                                          since: float) -> None:
    holds = hold_take(held, queued, since, BATCH_MAX)
    assert holds == (held < BUSY_BATCH and queued >= BUSY_BATCH and since < HOLD_MAX_S)
    if queued < BUSY_BATCH:  # low load: nothing waits behind the take, so nothing is held (latency first)
        assert not holds


def test_a_take_is_held_until_it_makes_a_busy_batch_or_its_time_is_up() -> None:
    assert hold_take(7, 1500, 0.0, BATCH_MAX)  # a few records while 1,500 wait: wait for the next take
    assert not hold_take(BUSY_BATCH, 1500, 0.0, BATCH_MAX)  # a busy batch already
    assert not hold_take(7, BUSY_BATCH - 1, 0.0, BATCH_MAX)  # no backlog
    assert not hold_take(7, 1500, HOLD_MAX_S, BATCH_MAX)  # held long enough
    assert not hold_take(7, 1500, 0.0, 7)  # a batch's maximum never waits
