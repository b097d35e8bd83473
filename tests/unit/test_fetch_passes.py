"""The fetcher's passes over Stripe's failed payment attempts, which only accumulate (app/fetch_passes.py,
app/fetcher.py sync_parked): the full query at the first pass, then once an hour, and again while one
finds a full page or the API failed one of its fetches; the passes between ask for what was written
since the last complete full pass began by PostgreSQL's clock, less what was not due then and a
margin, and about what the fetcher asked before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from app import fetcher as fetcher_module
from app.core import stripe as core
from app.fetch_passes import FULL_PAGE, FULL_PASS_S, RECENT_MARGIN_S
from app.fetcher import Fetcher
from app.gateways import registry
from tests.support import make_settings, serve_in_thread

PG_EPOCH = datetime(2026, 12, 7, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Pool:
    """Answers each query with the ids set for it, and records what was asked; PostgreSQL's clock is
    ``pg_s`` seconds after PG_EPOCH, apart from the fetcher's, and each query takes 7 s of it."""

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
        self.pg_s += 7
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
        if resource_id.startswith("pi_err"):  # the API failed every attempt (as fetch_resource counts it)
            fetcher._fetch_errors[name] = fetcher._fetch_errors.get(name, 0) + 1
            return 0
        return 1

    monkeypatch.setattr(fetcher, "sync_resource", sync_resource)
    monkeypatch.setattr(fetcher.metrics.passes, "inc", lambda: None)
    return fetcher, pool, clock, fetched


def stripe_queries(pool: Pool) -> list[str]:
    return ["full" if q is core.FETCH_WANTED else "recent" for q, _ in pool.asked
            if q in (core.FETCH_WANTED, core.FETCH_WANTED_RECENT)]


def test_the_hour_and_the_margin() -> None:
    assert (FULL_PASS_S, RECENT_MARGIN_S, FULL_PAGE) == (3600.0, 600.0, 500)  # as the docs say


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
    # since the full pass began by PostgreSQL's clock (before its query), less what was not due yet
    # then and the margin
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


async def test_a_recent_pass_asks_again_about_what_it_asked_before(passes: Passes) -> None:
    """A resource answered before and not backing off is checked again by a recent pass, as a full
    pass would, however long ago it was written; one backing off is left out until its wait ends."""
    fetcher, pool, clock, _ = passes
    pool.full = ["pi_gone", "pi_once"]
    await fetcher.sync_parked()
    fetcher._answered("stripe:pi_gone", "not found")
    fetcher._answered("stripe:pi_gone", "not found")  # the same answer again: backing off
    fetcher._answered("stripe:pi_once", "evt_1")
    clock.now += 30
    await fetcher.sync_parked()
    _, waiting, _, asked = pool.asked[-1][1]
    assert (waiting, asked) == (["pi_gone"], ["pi_once"])
    assert "stripe:pi_once" not in fetcher._unchanged  # checked again and no longer wanted: forgotten
    clock.now += 3 * fetcher.settings.fetch_parked_after_s  # pi_gone's wait is over
    pool.recent = ["pi_gone"]
    await fetcher.sync_parked()
    assert pool.asked[-1][1][3] == ["pi_gone"] and fetcher._unchanged["stripe:pi_gone"][:2] == ("not found", 1)


def test_every_parked_query_takes_a_full_page_at_most() -> None:
    """A full pass that found FULL_PAGE resources is made again: the queries' LIMIT must be it."""
    for gateway in registry.GATEWAYS.values():
        fetch = gateway.fetch
        for query in (fetch.parked, fetch.parked_recent) if fetch is not None else ():
            if query is not None:
                assert query.rstrip().endswith(f"LIMIT {FULL_PAGE}"), gateway.name


async def test_only_the_api_failing_counts_against_a_full_pass() -> None:
    """5xx, 429 and no answer are the API's (its resources are asked again at the next pass); a 404,
    a 400 or an answer that does not read are the resource's, backed off or set aside as before."""

    async def answer(request: web.Request) -> web.Response:
        status = int(request.match_info["status"])
        return web.Response(status=200, text="not json") if status == 200 else web.Response(status=status)

    app = web.Application()
    app.router.add_get("/{status}", answer)
    with serve_in_thread(app) as url:
        fetcher = Fetcher(make_settings("127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "unit",
                                        api_urls={"stripe": url}))
        counted = []
        async with aiohttp.ClientSession() as fetcher.http:
            for status in (503, 429, 404, 400, 200):
                await fetcher.fetch_resource("stripe", f"{url}/{status}", "pi_x", attempts=1)
                counted.append(fetcher._fetch_errors.get("stripe", 0))
            await fetcher.fetch_resource("stripe", "http://127.0.0.1:1/refused", "pi_x", attempts=1)
    assert counted == [1, 2, 2, 2, 2] and fetcher._fetch_errors == {"stripe": 3}
