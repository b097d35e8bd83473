"""The pg gateway end to end: HTTP → orderly.raw → Faust worker → decisions → PostgreSQL, with the
effects delivered to a stub merchant endpoint. The document's cases, as written."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.simulator import api
from app.simulator.lifecycles import Emitted, Truth
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.pg_events import AMOUNT, deposit, withdrawal
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings, read_topic, serve_in_thread
from topics.catalog import names

# the pg gateway's event API (GET /v1/pay/events), serving what tests put in here
API_EVENTS: list[Emitted] = []


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    namespace = f"pg{uuid.uuid4().hex[:8]}"
    with serve_in_thread(api.build(Truth(), API_EVENTS)) as api_url:
        s = make_settings(kafka.bootstrap, postgres.dsn, namespace, gap_backfill_after_s=2.0, pg_api_url=api_url,
                          fetch_interval_s=0.5)
        with running_pipeline(s, tmp_path_factory.mktemp("pg-pipeline")) as running:
            yield running


async def post(pipe: Running, *bodies: bytes) -> list[dict[str, Any]]:
    return await pipe.post("pg", *bodies)


async def correlate(pipe: Running, dep: str, user: str | None = None, wait: bool = True) -> None:
    """Register the mapping; by default wait until the worker has it (raw and correlations are two
    topics, so without waiting the deposit's first events may legitimately be parked)."""
    body = {"merchant_reference": f"mr_{dep}", "our_order_id": f"ord_{dep}", "our_user_id": user or f"usr_{dep}"}
    async with aiohttp.ClientSession() as http, http.put(
            f"{pipe.ingest.url}/correlations/pg/deposits/{dep}", data=orjson.dumps(body),
            headers={"Authorization": f"Bearer {pipe.settings.api_token}"}) as resp:
        assert resp.status == 200
    if wait:
        await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM webhook_events WHERE resource_id = $1 "
                                                 "AND event_type = 'correlation.registered'", dep))


async def outcomes(pipe: Running, resource: str, count: int) -> list[str]:
    async def check(conn: Any) -> list[str] | None:
        rows = await conn.fetch("SELECT outcome FROM webhook_events WHERE resource_id = $1 "
                                "AND event_type <> 'correlation.registered' ORDER BY received_at", resource)
        return [r["outcome"] for r in rows] if len(rows) >= count and "parked" not in [r["outcome"] for r in rows] \
            else None
    result: list[str] = await pipe.wait_for(check)
    return result


async def effect_keys(pipe: Running, resource: str) -> list[str]:
    conn = await pipe.connect()
    try:
        return [r["dedupe_key"] for r in await conn.fetch(
            "SELECT dedupe_key FROM effects WHERE resource_id = $1 ORDER BY dedupe_key", resource)]
    finally:
        await conn.close()


async def balance(pipe: Running, user: str) -> int:
    conn = await pipe.connect()
    try:
        return int(await conn.fetchval("SELECT coalesce(sum(amount_minor), 0) FROM ledger_entries WHERE user_id = $1",
                                       user))
    finally:
        await conn.close()


async def delivered(pipe: Running, keys: list[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(pipe.stub.deliveries[k] for k in keys):
        await asyncio.sleep(0.2)
    assert {k: pipe.stub.deliveries[k] for k in keys} == dict.fromkeys(keys, 1)


async def test_case_a_expired_after_settled(pipe: Running) -> None:
    await correlate(pipe, "dep_a")
    await post(pipe, deposit("dep_a", 7, "slip_received"), deposit("dep_a", 9, "settled"),
               deposit("dep_a", 6, "expired"))
    assert await outcomes(pipe, "dep_a", 3) == ["applied", "applied", "stale"]
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM pg_deposits WHERE pg_deposit_id = 'dep_a'"))
    assert (row["status"], row["pg_version"], row["credited_user_at"] is not None) == ("settled", 9, True)
    # slip_received takes the switch's default branch (a snapshot effect keyed on the event)
    assert await effect_keys(pipe, "dep_a") == ["deposit:dep_a:credit_user", "deposit:dep_a:release_goods",
                                                "evt_dep_a_v7:update_order_status"]
    assert await balance(pipe, "usr_dep_a") == AMOUNT
    await delivered(pipe, ["deposit:dep_a:credit_user", "deposit:dep_a:release_goods"])


async def test_case_b_settled_after_reversed(pipe: Running) -> None:
    await correlate(pipe, "dep_b")
    await post(pipe, deposit("dep_b", 12, "reversed"), deposit("dep_b", 9, "settled"))
    assert await outcomes(pipe, "dep_b", 2) == ["applied", "stale"]
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM pg_deposits WHERE pg_deposit_id = 'dep_b'"))
    assert (row["status"], row["credited_user_at"]) == ("reversed", None)
    assert await effect_keys(pipe, "dep_b") == []
    assert await balance(pipe, "usr_dep_b") == 0


async def test_case_c_withdrawal_filled_out_of_order(pipe: Running) -> None:
    def fill(n: int, amount: int) -> dict[str, Any]:
        return {"leg_ref": f"leg_c{n}", "sequence": n, "amount_minor": amount, "settled_at": "2026-11-29T10:00:00Z"}
    await post(pipe, withdrawal("wdr_c", 9, "filling", 700_000, fill=fill(2, 300_000)),
               withdrawal("wdr_c", 11, "settled", 1_000_000, fill=fill(3, 300_000)),
               withdrawal("wdr_c", 7, "filling", 400_000, fill=fill(1, 400_000)))
    assert await outcomes(pipe, "wdr_c", 3) == ["applied", "applied", "stale"]
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM pg_withdrawals WHERE pg_withdrawal_id = 'wdr_c'"))
    assert (row["filled_minor"], row["remaining_minor"], row["closed_at"] is not None) == (1_000_000, 0, True)
    fills = await pipe.wait_for(lambda c: c.fetch("SELECT leg_ref FROM pg_withdrawal_fills WHERE "
                                                  "pg_withdrawal_id = 'wdr_c' ORDER BY leg_ref"))
    assert [f["leg_ref"] for f in fills] == ["leg_c1", "leg_c2", "leg_c3"]
    assert await effect_keys(pipe, "wdr_c") == ["withdrawal:wdr_c:close_payout"]
    await delivered(pipe, ["withdrawal:wdr_c:close_payout"])


async def test_attribute_only_update_and_duplicate_delivery(pipe: Running) -> None:
    await correlate(pipe, "dep_d")
    settled = deposit("dep_d", 9, "settled")
    await post(pipe, settled, settled, deposit("dep_d", 10, "settled", note="attribute change"))
    assert await outcomes(pipe, "dep_d", 3) == ["applied", "duplicate", "applied"]
    row = await pipe.wait_for(lambda c: c.fetchrow(
        "SELECT * FROM pg_deposits WHERE pg_deposit_id = 'dep_d' AND pg_version = 10"))
    assert row["status"] == "settled"
    assert await effect_keys(pipe, "dep_d") == ["deposit:dep_d:credit_user", "deposit:dep_d:release_goods"]
    assert await balance(pipe, "usr_dep_d") == AMOUNT


async def test_late_slip_after_expiry(pipe: Running) -> None:
    await correlate(pipe, "dep_e")
    await post(pipe, deposit("dep_e", 6, "expired", event_id="evt_e6"), deposit("dep_e", 9, "settled"))
    assert await outcomes(pipe, "dep_e", 2) == ["applied", "applied"]
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) >= 3 FROM effects WHERE resource_id = 'dep_e'"))
    assert await effect_keys(pipe, "dep_e") == ["deposit:dep_e:credit_user", "deposit:dep_e:release_goods",
                                                "evt_e6:show_late_slip"]


async def test_overpayment_flag_from_a_stale_event(pipe: Running) -> None:
    await correlate(pipe, "dep_f")
    flag = {"claim_id": "clm_f", "cause": "same_transfer_excess", "amount_minor": 2000,
            "slip_received_at": "2026-11-29T10:30:00Z", "status": "open", "action_required": "contact_support"}
    await post(pipe, deposit("dep_f", 12, "reversed"), deposit("dep_f", 11, "settled", overpayment=flag))
    assert await outcomes(pipe, "dep_f", 2) == ["applied", "stale"]
    row = await pipe.wait_for(lambda c: c.fetchrow(
        "SELECT * FROM pg_deposit_overpayment_flags WHERE claim_id = 'clm_f'"))
    assert (row["pg_deposit_id"], row["observed_deposit_version"], row["amount_minor"]) == ("dep_f", 11, 2000)


async def test_webhook_before_correlation_is_parked_visibly(pipe: Running) -> None:
    await post(pipe, deposit("dep_g", 9, "settled"))
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM webhook_events WHERE resource_id='dep_g' "
                                             "AND outcome='parked'"))
    status, body = await pipe.resource("pg", "dep_g")
    assert status == 200 and body["parked"] == 1 and body["state"] is None
    assert "correlation" in body["timeline"][0]["why"]  # the operator sees what it waits for
    assert await balance(pipe, "usr_dep_g") == 0
    await correlate(pipe, "dep_g")
    assert await outcomes(pipe, "dep_g", 1) == ["unparked"]
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM ledger_entries WHERE user_id = 'usr_dep_g'"))
    assert await balance(pipe, "usr_dep_g") == AMOUNT
    status, body = await pipe.resource("pg", "dep_g")
    assert status == 200 and body["state"]["status"] == "settled" and body["parked"] == 0
    [delivery] = [d for d in body["timeline"] if d["event_type"] == "deposit.settled"]
    assert delivery["outcome"] == "unparked"
    assert sorted(e["type"] for e in delivery["effects"]) == ["credit_user", "release_goods"]


async def test_timeline_of_case_a(pipe: Running) -> None:
    await test_case_a_expired_after_settled(pipe) if not await effect_keys(pipe, "dep_a") else None
    status, body = await pipe.resource("pg", "dep_a")
    assert status == 200
    assert (await pipe.resource("pg", "dep_nope"))[0] == 404
    assert body["state"]["pg_version"] == 9
    timeline = [(d["event_type"], d["outcome"], len(d["effects"])) for d in body["timeline"]]
    assert timeline == [("correlation.registered", "applied", 0), ("deposit.slip_received", "applied", 1),
                        ("deposit.settled", "applied", 2), ("deposit.expired", "stale", 0)]


async def test_sequence_gap_is_recorded_and_backfilled_after_the_limit(pipe: Running) -> None:
    await correlate(pipe, "dep_s")
    base = 10_000_000
    await post(pipe, deposit("dep_s", 1, "pending", sequence=base), deposit("dep_s", 4, "pending", sequence=base + 3))
    gap = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM pg_sequence_gaps WHERE start_seq = $1", base + 1))
    assert gap["end_seq"] == base + 2
    # processing never waits on the gap: the later event is already applied
    assert await outcomes(pipe, "dep_s", 2) == ["applied", "applied"]
    await pipe.wait_for(lambda c: c.fetchval("SELECT backfill_requested_at FROM pg_sequence_gaps "
                                             "WHERE start_seq = $1", base + 1), timeout=60)
    requests = [orjson.loads(r.value) for r in await read_topic(pipe.settings.kafka_bootstrap,
                                                                 names(pipe.settings.namespace).fetch)]
    assert {"gateway": "pg", "kind": "backfill", "since_sequence": base, "until_sequence": base + 2} \
        .items() <= next(r for r in requests if r["since_sequence"] == base).items()
    # the late event closes the gap
    await post(pipe, deposit("dep_s", 2, "pending", sequence=base + 1),
               deposit("dep_s", 3, "pending", sequence=base + 2))
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 0 FROM pg_sequence_gaps WHERE start_seq >= $1", base))


LIFECYCLES = [["pending", "slip_received", "settled"], ["pending", "expired", "slip_received", "settled"],
              ["pending", "slip_received", "settled", "reversed"], ["pending", "expired"],
              ["pending", "settled", "settled", "reversed"]]


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")  # see test_ingest_fuzz
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
@given(data=st.data())
def test_any_order_and_duplication_over_http(pipe: Running, data: st.DataObject) -> None:
    dep = f"dep_h{uuid.uuid4().hex[:8]}"
    statuses = data.draw(st.sampled_from(LIFECYCLES))
    events: list[bytes | None] = [deposit(dep, 2 * i + 1, s) for i, s in enumerate(statuses)]
    events.append(None)  # the correlation, at any position
    order = data.draw(st.permutations(events + data.draw(st.lists(st.sampled_from(events), max_size=3))))
    final_status = statuses[-1]

    async def scenario() -> None:
        for ev in order:
            if ev is None:
                await correlate(pipe, dep, wait=False)  # a repeat PUT is idempotent
            else:
                await post(pipe, ev)
        row = await pipe.wait_for(lambda c: c.fetchrow(
            "SELECT * FROM pg_deposits WHERE pg_deposit_id = $1 AND pg_version = $2", dep, 2 * len(statuses) - 1))
        assert row["status"] == final_status
        deliveries = len(order) - order.count(None)
        await pipe.wait_for(lambda c: c.fetchval(
            "SELECT count(*) >= $2 FROM webhook_events WHERE resource_id = $1 AND outcome <> 'parked' "
            "AND event_type <> 'correlation.registered'", dep, deliveries))
        keys = await effect_keys(pipe, dep) if final_status != "expired" else []
        truth = AMOUNT if final_status == "settled" else 0
        assert await balance(pipe, f"usr_{dep}") == truth
        one_shot = [k for k in keys if k.startswith("deposit:")]
        assert len(one_shot) == len(set(one_shot))
        if final_status == "settled":
            assert f"deposit:{dep}:credit_user" in one_shot

    asyncio.run(scenario())


async def test_a_gap_older_than_the_limit_is_backfilled_from_the_gateway(pipe: Running) -> None:
    await correlate(pipe, "dep_bf")
    base = 20_000_000
    withheld = [deposit("dep_bf", 2, "slip_received", sequence=base + 1),
                deposit("dep_bf", 3, "settled", sequence=base + 2)]
    API_EVENTS.extend(Emitted("pg", "dep_bf", body, 0) for body in withheld)  # the gateway has them; we never got them
    await post(pipe, deposit("dep_bf", 1, "pending", sequence=base), deposit("dep_x", 1, "pending", sequence=base + 3))
    # 2 s later the gap is due: a backfill request, the fetcher asks the gateway, the events arrive
    row = await pipe.wait_for(lambda c: c.fetchrow(
        "SELECT * FROM pg_deposits WHERE pg_deposit_id = 'dep_bf' AND status = 'settled'"), timeout=90)
    assert row["pg_version"] == 3
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 0 FROM pg_sequence_gaps WHERE start_seq > $1 AND start_seq <= $2", base, base + 3))
    assert await balance(pipe, "usr_dep_bf") == AMOUNT
