"""Milliseconds since the epoch written as the ISO-8601 text the read models and facts hold (pure layer).

``iso_ms(ms)`` is exactly ``datetime.fromtimestamp(ms / 1000, UTC).isoformat()``, which release 0.2
wrote, and which the decision path called two or three times per card or pg record (about 4 % of
its instructions). For the years 2000..2099 it is built from cached pieces instead: the day's date
once per day, a second's text once per second, then a table lookup. That is exact there:
``ms / 1000`` is within a quarter of a microsecond of the true value, so ``fromtimestamp`` rounds it
to exactly the millisecond's microseconds. Any other value takes ``datetime``'s own path (and raises as it does).
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

DAY_MS = 86_400_000
FIRST_MS, END_MS = 946_684_800_000, 4_102_444_800_000  # 2000-01-01 and 2100-01-01, UTC
_TWO = [f"{i:02d}" for i in range(60)]
_MILLIS = [f".{i:03d}000+00:00" for i in range(1000)]  # isoformat writes microseconds: ms * 1000
_MILLIS[0] = "+00:00"  # and none at all when they are zero


@lru_cache(maxsize=4096)  # a day's date, for the days a worker's records fall on: a handful at a time
def _day(day: int) -> str:
    return datetime.fromtimestamp(day * 86_400, UTC).date().isoformat() + "T"


# A second's text, for the seconds a batch's records fall on: a record's receipt and its neighbours'
# share theirs, so most calls are one lookup in C (building it takes about 5 k instructions).
@lru_cache(maxsize=16_384)
def _second(second: int) -> str:
    day, in_day = divmod(second, 86_400)
    minutes, seconds = divmod(in_day, 60)
    hour, minute = divmod(minutes, 60)
    two = _TWO
    return f"{_day(day)}{two[hour]}:{two[minute]}:{two[seconds]}"


def iso_ms(ms: int) -> str:
    """``datetime.fromtimestamp(ms / 1000, UTC).isoformat()``, for less."""
    if not FIRST_MS <= ms < END_MS:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat()
    return _second(ms // 1000) + _MILLIS[ms % 1000]
