"""The fetcher's passes over Stripe's failed payment attempts, which only accumulate (app/fetcher.py
sync_parked): the full query at the first pass, then once an hour, and again while one finds a full
page or the API failed one of its fetches; the passes between ask for what was received since the
last complete full pass began by PostgreSQL's clock, less what was not due then and a margin; what
they cannot see keeps its back-off."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app import fetcher as fetcher_module
from app.core import stripe as core
from app.fetcher import FULL_PAGE, FULL_PASS_S, RECENT_MARGIN_S, Fetcher
from app.gateways import registry
from tests.support import make_settings

PG_EPOCH = datetime(2026, 12, 7, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Pool:
    """Answers each query with the ids set for it, and records what was asked; PostgreSQL's clock is
    ``pg_s`` seconds after PG_EPOCH, apart from the fetcher's."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, tuple[Any, ...]]] = []
        self.full: list[str] = []
        self.recent: list[str] = []
        self.pg_s = 0.0

    async def fetchval(self, query: str) -> datetime:
        assert query == "SELECT now()"
        return PG_EPOCH + timedelta(seconds=self.pg_s)

    async def fetch(self, query: str, *args: Any) -> list[dict[str, str]]:
        self.asked.append((query, args))
        ids = self.full if query is core.FETCH_WANTED else self.recent if query is core.FETCH_WANTED_RECENT else []
        return [{"id": i} for i in ids]


Passes = tuple[Fetcher, Pool, Clock, list[str]]


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> Passes:
    clock = Clock()
    monkeypatch.setattr(fetcher_module, "time", clock)
    fetcher = Fetcher(make_settings("127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "unit",
                                    api_urls={"stripe": "http://127.0.0.1:1"}, gateways=("pg", "stripe")))
    pool = Pool()
    fetcher.pool = pool  # type: ignore[assignment]
    fetched: list[str] = []

    async def sync_resource(name: str, resource_id: str) -> int:
        fetched.append(resource_id)
        if resource_id.startswith("pi_err"):  # the API failed every attempt
            fetcher._fetch_errors += 1
            return 0
        return 1

    monkeypatch.setattr(fetcher, "sync_resource", sync_resource)
    monkeypatch.setattr(fetcher.metrics.passes, "inc", lambda: None)
    return fetcher, pool, clock, fetched


def stripe_queries(pool: Pool) -> list[str]:
    return ["full" if q is core.FETCH_WANTED else "recent" for q, _ in pool.asked
            if q in (core.FETCH_WANTED, core.FETCH_WANTED_RECENT)]


async def test_a_full_pass_first_then_recent_ones_for_an_hour(passes: Passes) -> None:
    fetcher, pool, clock, fetched = passes
    pool.full, pool.recent, pool.pg_s = ["pi_old", "pi_new"], ["pi_new"], 5000.0
    await fetcher.sync_parked()
    full_began = clock.now
    for _ in range(3):
        clock.now += 30
        pool.pg_s += 400  # PostgreSQL's clock is not the fetcher's (a suspended host, a slow pass)
        await fetcher.sync_parked()
    clock.now = full_began + FULL_PASS_S
    await fetcher.sync_parked()
    assert stripe_queries(pool) == ["full", "recent", "recent", "recent", "full"]
    # since the full pass began by PostgreSQL's clock, less what was not due yet then and the margin
    since = PG_EPOCH + timedelta(seconds=5000.0 - fetcher.settings.fetch_parked_after_s - RECENT_MARGIN_S)
    assert [args[2] for q, args in pool.asked if q is core.FETCH_WANTED_RECENT] == [since] * 3
    assert fetched == ["pi_old", "pi_new", "pi_new", "pi_new", "pi_new", "pi_old", "pi_new"]


async def test_a_full_page_or_a_failed_fetch_makes_the_next_pass_a_full_one_too(passes: Passes) -> None:
    fetcher, pool, clock, _ = passes
    pool.full = [f"pi_{i}" for i in range(FULL_PAGE)]  # a backlog: more may wait behind the page
    await fetcher.sync_parked()
    clock.now += 30
    pool.full = ["pi_err", "pi_ok"]  # the API failed one: asked again at the next pass, not in an hour
    await fetcher.sync_parked()
    clock.now += 30
    pool.full = ["pi_ok"]
    await fetcher.sync_parked()
    clock.now += 30
    await fetcher.sync_parked()
    assert stripe_queries(pool) == ["full", "full", "full", "recent"]


async def test_what_a_recent_pass_cannot_see_keeps_its_back_off(passes: Passes) -> None:
    fetcher, pool, clock, _ = passes
    pool.full = ["pi_gone", "pi_once"]
    await fetcher.sync_parked()
    fetcher._answered("stripe:pi_gone", "not found")
    fetcher._answered("stripe:pi_gone", "not found")  # the same answer again: backing off
    fetcher._answered("stripe:pi_once", "evt_1")  # answered once: nothing to keep
    clock.now += 3 * fetcher.settings.fetch_parked_after_s  # pi_gone's wait is over
    await fetcher.sync_parked()  # recent: both older than it reads
    assert fetcher._unchanged["stripe:pi_gone"][:2] == ("not found", 1) and "stripe:pi_once" not in fetcher._unchanged
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
