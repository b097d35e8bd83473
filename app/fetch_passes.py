"""Which of a gateway's parked resources the fetcher's pass reads: all of them, or those that can
have changed since the last full pass (I/O shell around the registry's ``Fetch`` queries).

A gateway with a ``parked_recent`` query (Stripe: failed payment attempts only accumulate; a
decline is common and an abandoned PaymentIntent is never terminal) runs its full ``parked`` query at
the first pass, then once an hour, and again at the next pass while the last one found a full page
(the LIMIT of every parked query: a backlog) or the API failed one of its fetches (an outage: its
resources are asked again at the next pass, as before). The passes between run ``parked_recent``:
the resources with rows written since the last complete full pass began (PostgreSQL's clock), less
ORDERLY_FETCH_PARKED_AFTER_S (what was not due then) and a margin for a transaction still open then,
and the resources the fetcher asked about and is no longer waiting on (``$4``: what it last heard
of them, or their back-off, is checked again as a full pass would). Every other gateway's pass is
a full one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from app.gateways.registry import Fetch

FULL_PASS_S = 3600.0
FULL_PAGE = 500
RECENT_MARGIN_S = 600.0


@dataclass
class Wanted:
    ids: list[str]
    began: datetime | None  # a full pass of a gateway with a recent query: PostgreSQL's time as it began


@dataclass
class FullPasses:
    """Per gateway, when its last complete full pass began (the fetcher's monotonic clock, and
    PostgreSQL's)."""

    done: dict[str, tuple[float, datetime]] = field(default_factory=dict)

    async def wanted(self, pool: Any, name: str, fetch: Fetch, after_s: float, waiting: list[str],
                     asked: list[str], now: float) -> Wanted:
        """The ids to fetch this pass, ``waiting`` (backing off) left out; ``asked``: the others the
        fetcher remembers an answer for."""
        assert fetch.parked is not None
        full = self.done.get(name)
        if fetch.parked_recent is not None and full is not None and now - full[0] < FULL_PASS_S:
            since = full[1] - timedelta(seconds=after_s + RECENT_MARGIN_S)
            return Wanted([r["id"] for r in await pool.fetch(fetch.parked_recent, after_s, waiting, since, asked)],
                          None)
        began = await pool.fetchval("SELECT now()") if fetch.parked_recent is not None else None
        return Wanted([r["id"] for r in await pool.fetch(fetch.parked, after_s, waiting)], began)

    def fetched(self, name: str, wanted: Wanted, failed: int, now: float) -> bool:
        """Record a full pass as complete once its fetches are made (``failed``: the API failed that
        many); False when it was not (the next pass is a full one too)."""
        if wanted.began is None:
            return True
        if len(wanted.ids) >= FULL_PAGE or failed:
            return False
        self.done[name] = (now, wanted.began)
        return True
