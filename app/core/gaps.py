"""Sequence gap tracking for a gateway whose sequence is global and increasing (pure layer).

The pg document: a gap is not proof of loss (an event can be inside its 92-hour retry cycle), so
it is a record and a metric, never a wait; only a gap still open after 4 days is fetched.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Gap:
    start: int
    end: int  # inclusive
    first_seen_ms: int
    backfill_requested: bool = False

    @property
    def missing(self) -> int:
        return self.end - self.start + 1


def observe(max_seen: int | None, gaps: list[Gap], seq: int, now_ms: int) -> tuple[int, list[Gap]]:
    """Fold one observed sequence number into (highest seen, open gaps sorted by start).

    O(log gaps) to find the gap a late number falls in: a burst of out-of-order deliveries can
    leave thousands of gaps open at once.
    """
    if max_seen is None:
        return seq, gaps
    if seq > max_seen + 1:
        return seq, [*gaps, Gap(max_seen + 1, seq - 1, now_ms)]
    if seq > max_seen:
        return seq, gaps
    i = bisect.bisect_right(gaps, seq, key=lambda g: g.start) - 1
    if i < 0 or not gaps[i].start <= seq <= gaps[i].end:
        return max_seen, gaps  # seen before, or before tracking began
    gap = gaps[i]
    # the late event fills its number: the gap shrinks or splits, keeping its first-seen time
    pieces = ([replace(gap, end=seq - 1)] if gap.start < seq else []) + \
             ([replace(gap, start=seq + 1)] if seq < gap.end else [])
    return max_seen, [*gaps[:i], *pieces, *gaps[i + 1:]]


def due_for_backfill(gaps: list[Gap], now_ms: int, after_ms: int) -> list[Gap]:
    return [g for g in gaps if not g.backfill_requested and now_ms - g.first_seen_ms >= after_ms]
