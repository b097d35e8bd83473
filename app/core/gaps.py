"""Sequence gap tracking for a gateway whose sequence is global and increasing (pure layer).

The pg document: a gap is not proof of loss (an event can be inside its 92-hour retry cycle), so
it is a record and a metric, never a wait; only a gap still open after 4 days is fetched.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import orjson


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


@dataclass
class Folded:
    """A batch of sequence numbers folded into some open gaps (:func:`observe_all`): the highest seen,
    the gaps now open, the given gaps that changed or closed (``removed``) and the gaps that are new,
    each with the given gap it was cut from (None: opened by this batch)."""

    max_seen: int | None
    gaps: list[Gap]
    removed: list[Gap]
    added: list[tuple[Gap, Gap | None]]


def observe_all(max_seen: int | None, gaps: list[Gap], seen: Iterable[tuple[int, int]]) -> Folded:
    """Fold each (sequence number, time seen) of ``seen`` in order, as :func:`observe` one by one
    would, into ``gaps`` (sorted by start, not changed): O(log gaps) to find a number's gap, and a
    gap cut in place (a C memmove), not a new list per late number, nor a hash of every gap to say
    what changed. ``gaps`` need only hold the gaps the numbers up to ``max_seen`` can fall in: the
    others would not change."""
    given, gaps = gaps, list(gaps)
    starts = [g.start for g in gaps]
    origins: list[Gap | None] = list(gaps)  # the given gap each one was cut from
    for seq, now_ms in seen:
        if max_seen is None:
            max_seen = seq
        elif seq > max_seen:
            if seq > max_seen + 1:
                gaps.append(Gap(max_seen + 1, seq - 1, now_ms))
                starts.append(max_seen + 1)
                origins.append(None)
            max_seen = seq
        else:
            i = bisect.bisect_right(starts, seq) - 1
            if i < 0 or gaps[i].end < seq:
                continue  # seen before, or before tracking began
            gap, origin = gaps[i], origins[i]
            pieces = ([Gap(gap.start, seq - 1, gap.first_seen_ms, gap.backfill_requested)] if gap.start < seq
                      else []) + ([Gap(seq + 1, gap.end, gap.first_seen_ms, gap.backfill_requested)]
                                  if seq < gap.end else [])
            gaps[i:i + 1] = pieces
            starts[i:i + 1] = [piece.start for piece in pieces]
            origins[i:i + 1] = [origin] * len(pieces)
    kept = {id(gap) for gap, origin in zip(gaps, origins, strict=True) if gap is origin}
    added = [(gap, origin) for gap, origin in zip(gaps, origins, strict=True) if gap is not origin]
    return Folded(max_seen, gaps, [g for g in given if id(g) not in kept], added)


def backfill_request(gateway: str, start: int, end: int, first_seen_ms: int | None = None) -> tuple[bytes, bytes]:
    """The (key, value) of an orderly.fetch record asking the fetcher for the events ``start``..``end``
    of ``gateway``'s sequence (the projector's pass and the console's "backfill now" alike)."""
    request: dict[str, Any] = {"gateway": gateway, "kind": "backfill", "since_sequence": start - 1,
                               "until_sequence": end}
    if first_seen_ms is not None:
        request["gap_first_seen_ms"] = first_seen_ms
    return f"{gateway}:sequence:{start}".encode(), orjson.dumps(request)


def due_for_backfill(gaps: list[Gap], now_ms: int, after_ms: int) -> list[Gap]:
    return [g for g in gaps if not g.backfill_requested and now_ms - g.first_seen_ms >= after_ms]
