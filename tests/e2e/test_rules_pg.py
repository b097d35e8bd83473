"""The pg document's rules that the case tests (test_pg_pipeline.py) leave open, end to end: HTTP →
orderly.raw → worker → PostgreSQL → merchant stub, with the expected values from
gateway-docs/pg-event-order-version-guard.txt and DESIGN.md §1/§2.1.

- the version guard's boundary: an equal version under a fresh event id is stale (apply iff
  version > stored; "No two events for the same object ever carry the same version");
- balance transactions: deduped on their id, accumulated, ``balance_after`` never the balance;
- the default gap-backfill limit of 4 days: a gap older than that is fetched with
  ``GET /v1/pay/events?since_sequence=N``, appended to orderly.raw, decided and closed; a younger
  one is not. Four days cannot pass in a test. A gap's first-seen time is when the ingest received
  the event after it (its received_at); so the two gaps' events are posted to two more ingest
  processes (`orderly ingest`, real HTTP, real Kafka) whose wall clocks run 97 h and 95 h behind
  under libfaketime (Debian's faketime package; make test installs it), and the projector, which
  decides which gaps are due, runs on the real clock with the default setting. No fake clock is in
  the production code.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.pg_events import AMOUNT, balance_txn, deposit, withdrawal
from tests.pipeline import Running, running_pipeline, start_past_ingest
from tests.support import make_settings, read_topic, serve_in_thread
from topics.catalog import names
from topics.records import DECISIONS, Decision

FOUR_DAYS_S = 4 * 24 * 3600  # "Only a gap still open after 4 days means something is genuinely lost"


@dataclass
class GatewayEvents:
    """The pg gateway's ``GET /v1/pay/events?since_sequence=N``: the events a test put in
    ``events`` with a sequence above N, in sequence order; every N asked for is kept in ``asked``."""

    url: str = ""
    events: list[bytes] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)


@contextmanager
def gateway_events() -> Iterator[GatewayEvents]:
    api = GatewayEvents()

    async def since(request: web.Request) -> web.Response:
        after, limit = int(request.query["since_sequence"]), int(request.query.get("limit", "100"))
        api.asked.append(after)
        page = sorted((e for e in map(orjson.loads, api.events) if e["sequence"] > after), key=lambda e: e["sequence"])
        return web.json_response({"data": page[:limit], "has_more": len(page) > limit})

    app = web.Application()
    app.router.add_get("/v1/pay/events", since)
    with serve_in_thread(app) as url:
        api.url = url
        yield api


@dataclass
class Rig:
    pipe: Running
    api: GatewayEvents


@pytest.fixture(scope="module")
def rig(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with gateway_events() as api:
        # no gap_backfill_after_s: the default is what the 4-day test is about
        s = make_settings(kafka.bootstrap, postgres.dsn, f"rp{uuid.uuid4().hex[:8]}", api_urls={"pg": api.url})
        with running_pipeline(s, tmp_path_factory.mktemp("rules-pg")) as running:
            yield Rig(running, api)


async def correlate(pipe: Running, dep: str) -> None:
    """Register the deposit's mapping and wait until the worker has it."""
    body = {"merchant_reference": f"mr_{dep}", "our_order_id": f"ord_{dep}", "our_user_id": f"usr_{dep}"}
    async with aiohttp.ClientSession() as http, http.put(
            f"{pipe.ingest.url}/correlations/pg/deposits/{dep}", data=orjson.dumps(body),
            headers={"Authorization": f"Bearer {pipe.settings.api_token.reveal()}"}) as resp:
        assert resp.status == 200, await resp.text()
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM webhook_events WHERE resource_id = $1 "
                                             "AND event_type = 'correlation.registered'", dep))


async def timeline(pipe: Running, resource: str, count: int) -> list[tuple[str, str]]:
    """(event id, outcome) of the resource's ``count`` webhook deliveries, in arrival order, once
    all are decided; more than ``count`` fails."""
    async def check(conn: Any) -> list[tuple[str, str]] | None:
        rows = await conn.fetch("SELECT event_id, outcome FROM webhook_events WHERE resource_id = $1 "
                                "AND event_type <> 'correlation.registered' ORDER BY received_at, seq", resource)
        return [(r["event_id"], r["outcome"]) for r in rows] if len(rows) >= count else None
    found: list[tuple[str, str]] = await pipe.wait_for(check)
    assert len(found) == count, found
    return found


async def decisions(pipe: Running, resource: str) -> list[Decision]:
    """The worker's decisions about the resource, as it wrote them to orderly.decisions."""
    records = await read_topic(pipe.settings.kafka_bootstrap, names(pipe.settings.namespace).decisions)
    return [d for d in map(DECISIONS.decode, (r.value for r in records)) if d.resource_id == resource]


async def fetchval(pipe: Running, query: str, *args: Any) -> Any:
    conn = await pipe.connect()
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


async def balance(pipe: Running, user: str) -> int:
    return int(await fetchval(pipe, "SELECT coalesce(sum(amount_minor), 0) FROM ledger_entries WHERE user_id = $1",
                              user))


async def delivered(pipe: Running, keys: list[str]) -> None:
    """Every one of ``keys`` delivered to the merchant, once."""
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = $2 FROM effects WHERE dedupe_key = ANY($1) "
                                             "AND delivered_at IS NOT NULL", keys, len(keys)))
    assert {k: pipe.stub.deliveries[k] for k in keys} == dict.fromkeys(keys, 1)


# --- the version guard's boundary ---------------------------------------------------------------

async def test_an_equal_version_under_a_fresh_event_id_is_stale(rig: Rig) -> None:
    pipe = rig.pipe
    await correlate(pipe, "dep_eq")
    # sequence 1 for every event: at or below the highest seen, so these open no sequence gap
    await pipe.post("pg", deposit("dep_eq", 9, "settled", sequence=1),
                    deposit("dep_eq", 9, "reversed", event_id="evt_dep_eq_fresh", sequence=1),
                    withdrawal("wdr_eq", 5, "filling", 400_000, sequence=1),
                    withdrawal("wdr_eq", 5, "settled", 1_000_000, event_id="evt_wdr_eq_fresh", sequence=1))
    # WHERE pg_version < EXCLUDED.pg_version: 9 < 9 is false, rowCount = 0, "definitively older"
    assert await timeline(pipe, "dep_eq", 2) == [("evt_dep_eq_v9", "applied"), ("evt_dep_eq_fresh", "stale")]
    assert await timeline(pipe, "wdr_eq", 2) == [("evt_wdr_eq_v5", "applied"), ("evt_wdr_eq_fresh", "stale")]
    conn = await pipe.connect()
    try:
        # the read-model rows are written in the same transaction as the stale delivery's timeline row
        dep = await conn.fetchrow("SELECT * FROM pg_deposits WHERE pg_deposit_id = 'dep_eq'")
        wdr = await conn.fetchrow("SELECT * FROM pg_withdrawals WHERE pg_withdrawal_id = 'wdr_eq'")
    finally:
        await conn.close()
    assert dep is not None and wdr is not None
    assert (dep["status"], dep["pg_version"], dep["reversed_at"]) == ("settled", 9, None)
    assert (wdr["status"], wdr["pg_version"], wdr["filled_minor"], wdr["remaining_minor"], wdr["closed_at"]) \
        == ("filling", 5, 400_000, 600_000, None)
    # no effect from either stale event: the settlement's credit and release only, no debit, no
    # hold, no close_payout (the withdrawal is not settled)
    by_event = {d.event_id: d for d in await decisions(pipe, "dep_eq") + await decisions(pipe, "wdr_eq")}
    assert (by_event["evt_dep_eq_fresh"].effects, by_event["evt_wdr_eq_fresh"].effects) == ([], [])
    assert sorted(e.dedupe_key for d in by_event.values() for e in d.effects) \
        == ["deposit:dep_eq:credit_user", "deposit:dep_eq:release_goods"]
    await delivered(pipe, ["deposit:dep_eq:credit_user", "deposit:dep_eq:release_goods"])
    assert await balance(pipe, "usr_dep_eq") == AMOUNT
    assert await fetchval(pipe, "SELECT count(*) FROM effects WHERE resource_id = ANY($1)", ["dep_eq", "wdr_eq"]) == 2


# --- balance transactions -------------------------------------------------------------------------

def btxn(btxn_id: str, amount: int, balance_after: int, event_id: str) -> bytes:
    body = orjson.loads(balance_txn(btxn_id, amount, event_id=event_id))
    body["data"]["object"].update(source={"id": "dep_btr"}, balance_after=balance_after)
    return orjson.dumps(body)


async def test_balance_transactions_are_deduped_on_their_id_and_summed_never_from_balance_after(rig: Rig) -> None:
    pipe = rig.pipe
    first = btxn("btxn_r1", 300_000, balance_after=999_999, event_id="evt_btxn_r1")
    # the same immutable transaction redelivered under a fresh event id, and the first one again
    again = btxn("btxn_r1", 300_000, balance_after=999_999, event_id="evt_btxn_r1_again")
    # a later transaction whose snapshot says the balance is 42: a snapshot, not our balance
    second = btxn("btxn_r2", 200_000, balance_after=42, event_id="evt_btxn_r2")
    await pipe.post("pg", first, again, second, first)
    assert await timeline(pipe, "btxn_r1", 3) == [("evt_btxn_r1", "applied"), ("evt_btxn_r1_again", "duplicate"),
                                                  ("evt_btxn_r1", "duplicate")]
    assert await timeline(pipe, "btxn_r2", 1) == [("evt_btxn_r2", "applied")]
    conn = await pipe.connect()
    try:
        rows = await conn.fetch("SELECT * FROM pg_balance_txns WHERE source_id = 'dep_btr' ORDER BY btxn_id")
        total = await conn.fetchval("SELECT sum(amount_minor) FROM pg_balance_txns WHERE source_id = 'dep_btr'")
    finally:
        await conn.close()
    assert [(r["btxn_id"], r["type"], r["direction"], r["amount_minor"]) for r in rows] \
        == [("btxn_r1", "deposit", "credit", 300_000), ("btxn_r2", "deposit", "credit", 200_000)]
    assert total == 300_000 + 200_000  # accumulated from the amounts; neither 42 nor 999,999
    assert "balance_after" not in rows[0].keys()
    # immutable objects move no order: nothing for the merchant
    assert await fetchval(pipe, "SELECT count(*) FROM effects WHERE resource_id = ANY($1)",
                          ["btxn_r1", "btxn_r2"]) == 0


# --- gaps: the default limit of 4 days ----------------------------------------------------------

async def test_with_the_default_limit_a_gap_older_than_4_days_is_backfilled_and_a_younger_one_is_not(
        rig: Rig) -> None:
    pipe, api = rig.pipe, rig.api
    assert pipe.settings.gap_backfill_after_s == FOUR_DAYS_S  # the fixture's settings: the default
    # one hour either side of the limit: gaps first seen 97 h and 95 h ago
    older, younger = await asyncio.gather(start_past_ingest(pipe, (4 * 24 + 1) * 3600),
                                           start_past_ingest(pipe, (4 * 24 - 1) * 3600))
    try:
        await correlate(pipe, "dep_old")
        await correlate(pipe, "dep_young")
        seen = await fetchval(pipe, "SELECT max_seen FROM pg_sequence_state WHERE merchant = 'pg'")
        base = (seen or 0) + 1  # the next number: no gap opens before this test's own
        lost_old = [deposit("dep_old", 2, "slip_received", sequence=base + 1),
                    deposit("dep_old", 3, "settled", sequence=base + 2)]
        lost_young = deposit("dep_young", 2, "settled", sequence=base + 4)
        api.events += [*lost_old, lost_young]  # the gateway has them; their webhooks never reached us

        await older.post("pg", pipe.settings, deposit("dep_old", 1, "pending", sequence=base),
                         withdrawal("wdr_gap", 1, "filling", 0, sequence=base + 3))
        old = await pipe.wait_for(lambda c: c.fetchrow(
            "SELECT *, extract(epoch FROM now() - first_seen_at) / 3600 AS age_h FROM pg_sequence_gaps "
            "WHERE start_seq = $1", base + 1))
        await younger.post("pg", pipe.settings, deposit("dep_young", 1, "pending", sequence=base + 5))
        young = await pipe.wait_for(lambda c: c.fetchrow(
            "SELECT *, extract(epoch FROM now() - first_seen_at) / 3600 AS age_h FROM pg_sequence_gaps "
            "WHERE start_seq = $1", base + 4))
        assert (old["end_seq"], young["end_seq"]) == (base + 2, base + 4)
        # first seen when the ingest received the event after each gap: 97 h and 95 h ago
        assert (round(old["age_h"], 1), round(young["age_h"], 1)) == (97.0, 95.0)
        # processing never waited on either gap
        assert await timeline(pipe, "wdr_gap", 1) == [("evt_wdr_gap_v1", "applied")]
        assert await timeline(pipe, "dep_young", 1) == [("evt_dep_young_v1", "applied")]

        # the projector checks the open gaps when it starts and every 30 s, each check deciding
        # every open gap in one transaction, on the real clock and the default limit: started again,
        # it checks now (one of its periodic checks may already have requested the old gap)
        pipe.pipeline.kill("projector")
        pipe.pipeline.start("projector")
        # the fetcher asks GET /v1/pay/events?since_sequence=<the last number before the gap>, appends
        # what the gateway answers up to the gap's end to orderly.raw, and the worker decides it
        row = await pipe.wait_for(lambda c: c.fetchrow(
            "SELECT * FROM pg_deposits WHERE pg_deposit_id = 'dep_old' AND status = 'settled'"), timeout=60)
        await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 0 FROM pg_sequence_gaps WHERE start_seq = $1",
                                                 base + 1))
        assert row["pg_version"] == 3
        assert api.asked == [base]
        assert await timeline(pipe, "dep_old", 3) == [("evt_dep_old_v1", "applied"), ("evt_dep_old_v2", "applied"),
                                                      ("evt_dep_old_v3", "applied")]
        fetched = [(r.headers["delivery_id"], orjson.loads(r.value)["id"]) for r in await read_topic(
            pipe.settings.kafka_bootstrap, names(pipe.settings.namespace).raw) if r.headers.get("source") == "fetch"]
        assert fetched == [("fetch-evt_dep_old_v2", "evt_dep_old_v2"), ("fetch-evt_dep_old_v3", "evt_dep_old_v3")]
        await delivered(pipe, ["deposit:dep_old:credit_user", "deposit:dep_old:release_goods"])
        assert await balance(pipe, "usr_dep_old") == AMOUNT
        # the young gap, by the check that requested the old one and every one since: still open,
        # not requested, its event not fetched
        conn = await pipe.connect()
        try:
            still = await conn.fetchrow("SELECT * FROM pg_sequence_gaps WHERE start_seq = $1", base + 4)
            young_dep = await conn.fetchrow("SELECT * FROM pg_deposits WHERE pg_deposit_id = 'dep_young'")
        finally:
            await conn.close()
        assert still is not None and young_dep is not None
        assert (still["end_seq"], still["backfill_requested_at"]) == (base + 4, None)
        assert (young_dep["status"], young_dep["pg_version"]) == ("pending", 1)
    finally:
        for ingest in (older, younger):
            pipe.pipeline.terminate(ingest.name)
