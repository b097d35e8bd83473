"""The supervisor's restart delay: a first death is restarted at once (a worker's partitions wait
while it is down), a child that keeps dying is restarted ever more slowly, never slower than 30 s."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.supervisor import restart_delay


def test_the_first_death_is_restarted_at_once_then_the_delay_grows() -> None:
    assert [restart_delay(n) for n in range(1, 6)] == [0.0, 0.5, 1.0, 2.0, 4.0]


@given(st.integers(min_value=1, max_value=10_000), st.integers(min_value=1, max_value=10_000))
def test_the_delay_never_falls_and_stays_bounded(a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert 0.0 <= restart_delay(low) <= restart_delay(high) <= 30.0
    if high >= 2:
        assert restart_delay(high) > 0  # a crash loop never restarts at full speed
