"""Reads made on a timer follow what they look for, not the whole history (integration: real
PostgreSQL, no Kafka): the overview's counts are one count shared by every reader, recounted after
an operator's action; the projector's quarantine gauge and the fetcher's Stripe pass can read
through their partial indexes (migration 0016); the console's refresh of the counts no longer lists
resources (docs/operations.md, "Reads on a timer")."""

from __future__ import annotations

import asyncio
import random
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import pytest

from app.admin import actions, queries, resource_search
from app.admin.context import ADMIN
from app.core.stripe import FETCH_WANTED
from app.projector import QUARANTINED_BY_STAGE
from app.stack.postgres import PostgresServer
from projections.migrate import connect, migrate
from tests.integration.test_admin_auth_sessions import served
from tests.support import admin_token, make_settings


def app_metrics(app: Any) -> Any:
    return app[ADMIN].metrics


async def _deliveries(db: asyncpg.Connection, first: int, n: int, outcome: str) -> None:
    await db.execute("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, "
                     "received_at, outcome) SELECT 'd' || i, 'pg', 'e' || i, 'dep_' || i, 'deposit.updated', "
                     "now(), $3 FROM generate_series($1::int, $2::int) i", first, first + n - 1, outcome)


async def test_readers_share_one_count_and_an_action_counts_again(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    await _deliveries(db, 1, 30, "applied")
    await db.execute("INSERT INTO effects (dedupe_key, type, gateway, resource_id, payload, caused_by, dead_at, "
                     "attempts) VALUES ('k1', 'credit_user', 'pg', 'dep_1', '{}', 'd1', now(), 5)")
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    bearer = {"Authorization": f"Bearer {admin_token(settings)}"}
    async with served(settings) as (url, app), aiohttp.ClientSession(headers=bearer) as http:

        async def overview() -> dict[str, Any]:
            async with http.get(f"{url}/api/overview") as resp:
                assert resp.status == 200, await resp.text()
                body: dict[str, Any] = await resp.json()
                return body

        answers = await asyncio.gather(*(overview() for _ in range(16)))
        assert len({a["counted_at"] for a in answers}) == 1  # one count for sixteen readers at once
        first = answers[0]
        assert first["deliveries"] == {"total": {"applied": 30}, "last_hour": {"applied": 30}}
        assert (first["effects_dead"], first["effects_pending"]) == (1, 0)

        await _deliveries(db, 31, 5, "stale")
        await asyncio.sleep(first["counting_s"])  # an action counts again at once once a count's own time passed
        async with http.post(f"{url}/api/effects/k1/retry") as resp:
            assert resp.status == 200, await resp.text()
        after = await overview()  # within the second the counts stay fresh: the action made them stale
        assert after["counted_at"] != first["counted_at"]
        assert (after["effects_dead"], after["effects_pending"]) == (0, 1)
        assert after["deliveries"]["total"] == {"applied": 30, "stale": 5}
        assert app_metrics(app).overview_count_seconds._value.get() > 0


async def test_an_action_of_a_command_or_another_admin_makes_the_counts_stale(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    """The audit says when an operator last changed something, whichever process acted: counts
    begun before it are counted again, within the second they would otherwise stay fresh."""
    await db.execute("INSERT INTO effects (dedupe_key, type, gateway, resource_id, payload, caused_by, dead_at, "
                     "attempts) VALUES ('k1', 'credit_user', 'pg', 'dep_1', '{}', 'd1', now(), 5)")
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    bearer = {"Authorization": f"Bearer {admin_token(settings)}"}
    async with served(settings) as (url, _), aiohttp.ClientSession(headers=bearer) as http:
        async with http.get(f"{url}/api/overview") as resp:
            first = await resp.json()
        assert first["effects_dead"] == 1
        await asyncio.sleep(first["counting_s"])  # (as above)
        await actions.retry_effect(db, "k1", "cli:ana@host")  # `orderly effects retry k1`: another process
        async with http.get(f"{url}/api/overview") as resp:
            after = await resp.json()
        assert (after["effects_dead"], after["effects_pending"]) == (0, 1), after
        async with http.get(f"{url}/api/overview") as resp:
            assert (await resp.json())["counted_at"] == after["counted_at"]  # and fresh again


async def test_the_timer_reads_can_use_their_partial_indexes(db: asyncpg.Connection) -> None:
    """With sequential scans off, a plan still scans the table only when no index can answer it:
    the partial indexes' predicates match the queries'."""
    await db.execute("SET enable_seqscan = off")

    async def plan(query: str, *args: object) -> str:
        return "\n".join(r[0] for r in await db.fetch("EXPLAIN " + query, *args))

    assert "quarantine_open" in await plan(QUARANTINED_BY_STAGE)
    assert "Seq Scan on quarantine" not in await plan(QUARANTINED_BY_STAGE)
    wanted = await plan(FETCH_WANTED, 60.0, [])
    assert "webhook_events_stripe_failed" in wanted and "Seq Scan on webhook_events" not in wanted
    counts = await plan(queries.OVERVIEW)
    assert "quarantine_open" in counts
    assert "admin_actions_changes" in await plan(queries.LAST_CHANGE)
    # asyncpg prepares each statement: after five runs PostgreSQL may keep a plan for any parameters,
    # which must still narrow the scan by the parameters (an index condition, not a filter of all rows)
    await db.execute("SET plan_cache_mode = force_generic_plan")
    await db.execute(f"PREPARE wanted AS {FETCH_WANTED}")
    generic = [r[0] for r in await db.fetch("EXPLAIN EXECUTE wanted(60, '{}')")]
    assert any("webhook_events_stripe_failed" in line for line in generic), generic
    for n, (since, until) in enumerate([(True, "<"), (True, "<="), (True, None)]):
        await db.execute(f"PREPARE s{n} AS {resource_search.recent_statement(since, until)}")
        bounds = ", now()" * (1 + (until is not None))
        generic = [r[0] for r in await db.fetch(f"EXPLAIN EXECUTE s{n}(NULL, NULL, NULL, NULL, 10{bounds})")]
        assert any("Cond:" in line and "received_at >= $6" in line for line in generic), generic


async def test_the_refresh_of_the_counts_does_not_list_resources(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """The console's counts refresh every 5 s while a tab is open: only the counts, not the recent
    resources (a grouping of every delivery) the page shows once."""
    await _deliveries(db, 1, 3, "applied")
    searches: list[int] = []
    search = resource_search.search

    async def counted(*args: Any, **kw: Any) -> dict[str, Any]:
        searches.append(kw.get("limit", 0))
        return await search(*args, **kw)

    monkeypatch.setattr(resource_search, "search", counted)
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    jar = aiohttp.CookieJar(unsafe=True)  # cookies of an address, not a name
    async with served(settings) as (url, _), aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.post(f"{url}/login", data={"token": admin_token(settings), "next": "/"},
                             allow_redirects=False) as resp:
            assert resp.status == 303
        async with http.get(f"{url}/?partial=counts") as resp:
            assert resp.status == 200 and 'id="counts"' in await resp.text()
        assert searches == []
        async with http.get(f"{url}/") as resp:
            page = await resp.text()
            assert resp.status == 200 and "dep_1" in page  # the page itself lists the recent resources
        assert searches == [10]


async def _pages(fetch_page: Any, limit: int) -> list[tuple[str, str, Any, int, int, Any]]:
    """Every page, cursor after cursor: (gateway, id, last delivery, deliveries, parked, status) in order."""
    listed: list[tuple[str, str, Any, int, int, Any]] = []
    cursor = None
    for _ in range(500):
        page = await fetch_page(cursor)
        listed += [(r["gateway"], r["resource_id"], r["last_at"], r["deliveries"], r["parked"], r["status"])
                   for r in page["items"]]
        assert len(page["items"]) <= limit
        cursor = page["next_cursor"]
        if cursor is None:
            return listed
    raise AssertionError("the cursor never ended")


async def _lists_what_grouping_every_delivery_lists(db: asyncpg.Connection) -> None:
    rng = random.Random(47)
    now = datetime.now(UTC)
    ages = [0, 1, 9, 11, 30, 59, 61, 400, 500, 3_000, 4_000, 30_000, 40_000, 200_000, 300_000, 2e6, 3e6, 1e7,
            2e7, 1e8, 1.3e8, 3e8, 2e9, -60]  # 2e9: older than every slice (about 63 years)
    # ids whose order differs between a byte order and a language's (en_US: case and '-' nearly ignored)
    names = ["pi_3Nd", "pi_3N-d", "pi_3NAc", "pi_3NaB", "pi_3Nab", "pi_3nab", "pi_3N_ab", "pi_3NA-b"]
    rows = []
    for i in range(96):
        gw = rng.choice(["pg", "card", "stripe"])
        resource = f"{names[i % len(names)]}{i // len(names)}" if gw == "stripe" else f"r_{i}"
        for j in range(rng.randint(1, 4)):
            at = now - timedelta(seconds=rng.choice(ages)) if i % 7 else now - timedelta(seconds=3_000)  # ties
            outcome = "parked" if rng.random() < 0.15 else rng.choice(["applied", "stale", "duplicate"])
            rows.append((f"d{i}-{j}", gw, f"e{i}-{j}", resource, at, outcome))
    tied = now - timedelta(seconds=5)
    rows += [(f"t{k}", "stripe", f"et{k}", name, tied, "applied") for k, name in enumerate(names)]
    await db.executemany("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, "
                         "received_at, outcome) VALUES ($1, $2, $3, $4, 'x', $5, $6)", rows)
    await db.execute("INSERT INTO stripe_payment_intents (id, status) SELECT DISTINCT resource_id, "
                     "CASE WHEN length(resource_id) % 2 = 0 THEN 'succeeded' ELSE 'processing' END "
                     "FROM webhook_events WHERE gateway = 'stripe'")
    await db.execute("VACUUM ANALYZE webhook_events")  # the BRIN index summarised, as autovacuum leaves it
    statuses = queries.status_union()

    def every_delivery(gateway: str | None, limit: int) -> Any:
        async def page(cursor: str | None) -> dict[str, Any]:  # the grouping of every delivery, as before
            after = resource_search.Cursor.decode(cursor) if cursor else None
            found = await db.fetch(resource_search.SEARCH.format(statuses=statuses), gateway, None, None,
                                   after.last_at if after else None, after.gateway if after else None,
                                   after.resource_id if after else None, limit + 1)
            items = [dict(r) for r in found[:limit]]
            last = items[-1] if len(found) > limit else None
            return {"items": items, "next_cursor": resource_search.Cursor(
                last["last_at"], last["gateway"], last["resource_id"]).encode() if last else None}
        return page

    gateways: tuple[str | None, ...] = (None, "pg", "stripe")
    for gateway in gateways:
        for limit in (1, 3, 7, 50):
            expected = await _pages(every_delivery(gateway, limit), limit)
            listed = await _pages(
                lambda cursor, g=gateway, n=limit: resource_search.search(db, g, None, None, n, cursor), limit)
            assert listed == expected, (gateway, limit)
            if gateway is None:
                assert len(listed) == 96 + len(names)


async def test_newest_first_read_back_a_slice_at_a_time_lists_what_grouping_every_delivery_lists(
        db: asyncpg.Connection) -> None:
    """Without a text search or a status the listing reads back in time through the BRIN index (10 s,
    then eight times longer each, then all before); page after page it lists exactly what the query
    over every delivery lists: deliveries from seconds to 63 years old and one in the future, ties on
    the time, each gateway, a cursor at each page size."""
    await _lists_what_grouping_every_delivery_lists(db)


@pytest.fixture
def en_us_postgres(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A PostgreSQL server of its own that knows en_US.UTF-8 (compiled here with `localedef` from
    Debian's `locales`, which `make test` installs): its DSN."""
    locales = tmp_path_factory.mktemp("locales")  # under the tests' base folder, which the server's user reaches
    compiled = subprocess.run(["localedef", "-i", "en_US", "-f", "UTF-8", str(locales / "en_US.UTF-8")],
                              capture_output=True, text=True)
    assert compiled.returncode == 0, f"localedef failed (run `make locales`): {compiled.stderr.strip()}"
    for part in [locales, *locales.rglob("*")]:  # read by the server's own user when the tests run as root
        part.chmod(0o755 if part.is_dir() else 0o644)
    monkeypatch.setenv("LOCPATH", str(locales))  # the server started below inherits it
    server = PostgresServer(tmp_path_factory.mktemp("pg-en-us"))
    try:
        server.start()
        yield server.dsn
    finally:
        server.stop()


async def test_it_lists_the_same_in_a_database_of_another_collation(en_us_postgres: str) -> None:
    """PostgreSQL's docker image initialises its database in en_US.utf8, whose order of ids (case and
    '-' nearly ignored) is not a byte order: the slices are ranked, and the cursor compared, by the
    database alone (a page ranked in Python skipped rows here). The embedded server's is C."""
    admin = await asyncpg.connect(en_us_postgres)
    await admin.execute("CREATE DATABASE en_us TEMPLATE template0 ENCODING 'UTF8' LOCALE 'en_US.UTF-8'")
    await admin.close()
    dsn = en_us_postgres.rsplit("/", 1)[0] + "/en_us"
    setup = await asyncpg.connect(dsn)
    await migrate(setup, "t")
    await setup.close()
    db = await connect(dsn, "t")
    try:
        assert await db.fetchval("SELECT 'pi_3N-d' < 'pi_3NAc'") is False  # not a byte order
        await _lists_what_grouping_every_delivery_lists(db)
    finally:
        await db.close()


async def test_a_cursor_at_either_end_of_the_calendar_is_answered(db: asyncpg.Connection) -> None:
    await _deliveries(db, 1, 3, "applied")
    cursor = resource_search.Cursor(datetime(1, 1, 1, 0, 0, 30, tzinfo=UTC), "pg", "dep_1").encode()
    assert await resource_search.search(db, cursor=cursor) == {"items": [], "match": None, "next_cursor": None}
    cursor = resource_search.Cursor(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), "pg", "dep_1").encode()
    listed = (await resource_search.search(db, cursor=cursor))["items"]
    assert [r["resource_id"] for r in listed] == ["dep_3", "dep_2", "dep_1"]


async def test_a_resource_last_delivered_at_a_slices_edge_is_listed_once(db: asyncpg.Connection) -> None:
    """A slice takes its start and leaves its end to the newer slice: a resource whose last delivery
    is exactly at the edge is listed by the newer slice only, its earlier deliveries in the older
    slice notwithstanding (the slices after a cursor start at its time: their edges are known)."""
    t = datetime(2026, 12, 1, 12, tzinfo=UTC)
    first, longer, _ = resource_search.SLICES
    rows = [("x", "pg", "r_x", t), ("y1", "pg", "r_y", t - timedelta(seconds=first)),
            ("y2", "pg", "r_y", t - timedelta(seconds=first + 30)),
            ("z", "pg", "r_z", t - timedelta(seconds=first * (1 + longer)))]
    await db.executemany("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, "
                         "received_at, outcome) VALUES ($1, $2, $1, $3, 'x', $4, 'applied')", rows)
    cursor = resource_search.Cursor(t, "pg", "r_x").encode()
    listed = [(r["resource_id"], r["deliveries"]) for r in (await resource_search.search(db, cursor=cursor))["items"]]
    assert listed == [("r_y", 2), ("r_z", 1)]


async def test_a_delivery_stored_between_two_slices_does_not_hide_its_resource(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    """The slices are read in one snapshot: a delivery committed between two of them (the pipeline
    goes on meanwhile) neither moves its resource into a slice already read nor out of the next."""
    old = datetime.now(UTC) - timedelta(seconds=30)  # in the second slice
    await db.executemany("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, "
                         "received_at, outcome) VALUES ($1, 'pg', $1, $2, 'x', $3, 'applied')",
                         [("d_old", "r_old", old), ("d_other", "r_other", old - timedelta(seconds=1))])
    other = await connect(postgres.dsn, namespace)

    class Between:
        """The listing's connection; another stores a delivery of r_old after the first slice."""

        def __init__(self) -> None:
            self.slices = 0

        def transaction(self, **kw: Any) -> Any:
            return db.transaction(**kw)

        async def fetch(self, query: str, *args: Any) -> Any:
            self.slices += 1
            if self.slices == 2:
                await other.execute("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, "
                                    "event_type, received_at, outcome) VALUES ('d_new', 'pg', 'd_new', 'r_old', "
                                    "'x', now(), 'applied')")
            return await db.fetch(query, *args)

    try:
        listing = Between()
        items = (await resource_search.search(listing, limit=10))["items"]  # type: ignore[arg-type]
        listed = [(r["resource_id"], r["last_at"], r["deliveries"]) for r in items]
        # as one statement at the first slice's snapshot would list them: r_old where it was, one delivery
        assert listing.slices >= 2 and listed == [("r_old", old, 1), ("r_other", old - timedelta(seconds=1), 1)]
    finally:
        await other.close()


async def test_a_listing_past_its_deadline_is_given_up_and_leaves_its_connection_usable(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """All the slices together have the deadline of one statement: past it the read is cancelled, the
    snapshot rolled back, and the pooled connection serves the next request."""
    await _deliveries(db, 1, 3, "applied")
    monkeypatch.setattr(resource_search, "LISTING_DEADLINE_S", 0.3)
    locker = await connect(postgres.dsn, namespace)
    try:
        async with locker.transaction():
            await locker.execute("LOCK TABLE webhook_events IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(TimeoutError):
                await resource_search.search(db, limit=10)
        assert not db.is_in_transaction()
        assert len((await resource_search.search(db, limit=10))["items"]) == 3
    finally:
        await locker.close()


async def test_a_listing_after_a_migration_changed_a_column_under_it_is_prepared_anew(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    """Inside its snapshot asyncpg cannot prepare again a statement a schema change made stale, as it
    does outside a transaction ("cached plan must not change result type"): the listing is read once
    more, not answered 500 once per pooled connection after a migration."""
    await _deliveries(db, 1, 3, "applied")
    assert len((await resource_search.search(db, limit=10))["items"]) == 3  # its statements prepared and cached
    migrating = await connect(postgres.dsn, namespace)
    try:
        await migrating.execute("ALTER TABLE webhook_events ALTER COLUMN resource_id TYPE varchar(512)")
    finally:
        await migrating.close()
    listed = (await resource_search.search(db, limit=10))["items"]
    assert [r["resource_id"] for r in listed] == ["dep_3", "dep_2", "dep_1"]


async def test_a_statement_made_stale_inside_a_transaction_is_answered_503_try_again(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """Elsewhere (an action's transaction), the same failure rolls the request back: 503 and try
    again, not a 500 that reads as a bug."""

    async def stale(*args: Any, **kwargs: Any) -> Any:
        raise asyncpg.InvalidCachedStatementError("cached statement plan is invalid due to a database schema or "
                                                  "configuration change")

    monkeypatch.setattr(queries, "gaps", stale)
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    bearer = {"Authorization": f"Bearer {admin_token(settings)}"}
    async with served(settings) as (url, _), aiohttp.ClientSession(headers=bearer) as http:
        async with http.get(f"{url}/api/gaps") as resp:
            assert resp.status == 503, await resp.text()
            assert "schema changed" in (await resp.json())["detail"]
