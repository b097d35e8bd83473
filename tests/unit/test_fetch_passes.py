"""The fetcher's passes over Stripe's failed payment attempts, which only accumulate (app/fetcher.py
sync_parked): the full query at the first pass, then once an hour and while it finds a full page;
the passes between ask for what was received since the last full pass began, with a margin; what
they cannot see keeps its back-off."""

from __future__ import annotations

from typing import Any

import pytest

from app import fetcher as fetcher_module
from app.core import stripe as core
from app.fetcher import FULL_PAGE, FULL_PASS_S, RECENT_MARGIN_S, Fetcher
from app.gateways import registry
from tests.support import make_settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Pool:
    """Answers each query with the ids set for it, and records what was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, tuple[Any, ...]]] = []
        self.full: list[str] = []
        self.recent: list[str] = []

    async def fetch(self, query: str, *args: Any) -> list[dict[str, str]]:
        self.asked.append((query, args))
        ids = self.full if query is core.FETCH_WANTED else self.recent if query is core.FETCH_WANTED_RECENT else []
        return [{"id": i} for i in ids]


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> tuple[Fetcher, Pool, Clock, list[str]]:
    clock = Clock()
    monkeypatch.setattr(fetcher_module, "time", clock)
    fetcher = Fetcher(make_settings("127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "unit",
                                    api_urls={"stripe": "http://127.0.0.1:1"}, gateways=("pg", "stripe")))
    pool = Pool()
    fetcher.pool = pool  # type: ignore[assignment]
    fetched: list[str] = []

    async def sync_resource(name: str, resource_id: str) -> int:
        fetched.append(resource_id)
        return 1

    monkeypatch.setattr(fetcher, "sync_resource", sync_resource)
    monkeypatch.setattr(fetcher.metrics.passes, "inc", lambda: None)
    return fetcher, pool, clock, fetched


def stripe_queries(pool: Pool) -> list[str]:
    return ["full" if q is core.FETCH_WANTED else "recent" for q, _ in pool.asked
            if q in (core.FETCH_WANTED, core.FETCH_WANTED_RECENT)]


async def test_a_full_pass_first_then_recent_ones_for_an_hour(passes: tuple[Fetcher, Pool, Clock, list[str]]) -> None:
    fetcher, pool, clock, fetched = passes
    pool.full, pool.recent = ["pi_old", "pi_new"], ["pi_new"]
    await fetcher.sync_parked()
    full_began = clock.now
    for _ in range(3):
        clock.now += 30
        await fetcher.sync_parked()
    clock.now = full_began + FULL_PASS_S
    await fetcher.sync_parked()
    assert stripe_queries(pool) == ["full", "recent", "recent", "recent", "full"]
    recent_args = [args for q, args in pool.asked if q is core.FETCH_WANTED_RECENT]
    # since the full pass began, and the margin for the projector's lag and the clocks
    assert [args[2] for args in recent_args] == [30 + RECENT_MARGIN_S, 60 + RECENT_MARGIN_S, 90 + RECENT_MARGIN_S]
    assert fetched == ["pi_old", "pi_new", "pi_new", "pi_new", "pi_new", "pi_old", "pi_new"]


async def test_a_full_page_makes_the_next_pass_a_full_one_too(passes: tuple[Fetcher, Pool, Clock, list[str]]) -> None:
    fetcher, pool, clock, _ = passes
    pool.full = [f"pi_{i}" for i in range(FULL_PAGE)]  # a backlog: more may wait behind the page
    await fetcher.sync_parked()
    clock.now += 30
    await fetcher.sync_parked()
    pool.full = ["pi_last"]
    clock.now += 30
    await fetcher.sync_parked()
    clock.now += 30
    await fetcher.sync_parked()
    assert stripe_queries(pool) == ["full", "full", "full", "recent"]


async def test_what_a_recent_pass_cannot_see_keeps_its_back_off(passes: tuple[Fetcher, Pool, Clock, list[str]]) -> None:
    fetcher, pool, clock, _ = passes
    pool.full = ["pi_gone"]
    await fetcher.sync_parked()
    fetcher._answered("stripe:pi_gone", "not found")  # remembered: the same answer again doubles the wait
    clock.now += 30
    await fetcher.sync_parked()  # recent: pi_gone, due again, is older than it reads
    assert fetcher._unchanged["stripe:pi_gone"][:2] == ("not found", 0)
    pool.full = []
    clock.now += FULL_PASS_S
    await fetcher.sync_parked()  # full, and not found any more: forgotten
    assert "stripe:pi_gone" not in fetcher._unchanged


def test_every_parked_query_takes_a_full_page_at_most() -> None:
    """A full pass that found FULL_PAGE resources is made again: the queries' LIMIT must be it."""
    for gateway in registry.GATEWAYS.values():
        fetch = gateway.fetch
        for query in (fetch.parked, fetch.parked_recent) if fetch is not None else ():
            if query is not None:
                assert query.rstrip().endswith(f"LIMIT {FULL_PAGE}"), gateway.name
