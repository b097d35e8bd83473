"""The worker's pause between batches (app.worker.busy_pause): only after a large batch, only until
the interval since that batch was taken has passed, never negative."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.worker import BUSY_BATCH, busy_pause

sizes = st.integers(min_value=1, max_value=5000)
times = st.floats(min_value=0, max_value=1e6, allow_nan=False)
spans = st.floats(min_value=0, max_value=10, allow_nan=False)


@given(sizes, times, spans, st.floats(min_value=0.001, max_value=1))
def test_the_next_batch_is_taken_one_interval_after_a_large_one(size: int, taken: float, elapsed: float,
                                                                 interval: float) -> None:
    pause = busy_pause(size, taken, taken + elapsed, interval)
    if size < BUSY_BATCH or elapsed >= interval:
        assert pause == 0.0
    else:
        assert pause > 0
        assert abs((taken + elapsed + pause) - (taken + interval)) < 1e-6  # resumes at taken + interval


def test_a_small_batch_never_waits_and_a_large_one_waits_the_rest() -> None:
    assert busy_pause(BUSY_BATCH - 1, 10.0, 10.0, 0.1) == 0.0
    assert busy_pause(BUSY_BATCH, 10.0, 10.03, 0.1) == pytest.approx(0.07)
