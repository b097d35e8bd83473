"""iso_ms writes what datetime wrote (the bytes of card facts and pg rows depend on it)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.times import END_MS, FIRST_MS, iso_ms


def reference(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


@settings(max_examples=3000)
@given(st.integers(min_value=FIRST_MS - 10**6, max_value=END_MS + 10**6))
def test_iso_ms_is_datetimes_text_around_and_inside_the_cached_years(ms: int) -> None:
    assert iso_ms(ms) == reference(ms)


@given(st.integers(min_value=-(10**13), max_value=10**14))
def test_iso_ms_is_datetimes_text_anywhere_datetime_writes_one(ms: int) -> None:
    assert iso_ms(ms) == reference(ms)


@pytest.mark.parametrize("ms", [FIRST_MS, FIRST_MS - 1, END_MS - 1, END_MS, 0, 1_796_000_000_000,
                                1_796_000_000_001, 1_796_000_000_999, 1_796_000_059_000, 951_782_400_000])
def test_iso_ms_at_the_edges(ms: int) -> None:
    assert iso_ms(ms) == reference(ms)


def test_iso_ms_raises_as_datetime_does_far_out_of_range() -> None:
    with pytest.raises((OverflowError, ValueError, OSError)):
        reference(10**20)
    with pytest.raises((OverflowError, ValueError, OSError)):
        iso_ms(10**20)
