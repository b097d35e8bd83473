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
from tests.pg_truth import deposit_truth
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings, read_topic, serve_in_thread
from topics.catalog import names

# the pg gateway's event API (GET /v1/pay/events), serving what tests put in here
API_EVENTS: list[Emitted] = []


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    namespace = f"pg{uuid.uuid4().hex[:8]}"
    with serve_in_thread(api.build(Truth(), API_EVENTS)) as api_url:
        s = make_settings(kafka.bootstrap, postgres.dsn, namespace, gap_backfill_after_s=2.0, api_urls={"pg": api_url},
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
            headers={"Authorization": f"Bearer {pipe.settings.api_token.reveal()}"}) as resp:
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


async def delivered(pipe: Running, resource: str, expected: list[str], timeout: float = 30) -> None:
    """The merchant received exactly ``expected`` for ``resource``, each once: every key awaited at
    the stub, and no other key of the resource decided (the effects table) or delivered."""
    deadline = time.monotonic() + timeout
    while not all(pipe.stub.deliveries[k] for k in expected):
        assert time.monotonic() < deadline, {k: pipe.stub.deliveries[k] for k in expected}
        await asyncio.sleep(0.2)
    keys = await effect_keys(pipe, resource)
    assert keys == sorted(expected)
    assert {k: pipe.stub.deliveries[k] for k in {*keys, *expected}} == dict.fromkeys(expected, 1)


async def ledger_matches(pipe: Running, dep: str, expected: dict[str, int], user: str | None = None) -> None:
    """The user's ledger is exactly ``expected`` (entry key -> amount), every entry from ``dep``;
    call it after ``delivered``, so a wrong entry has had the time to be written."""
    want = {k: (amount, dep) for k, amount in expected.items()}
    conn = await pipe.connect()
    try:
        deadline = time.monotonic() + 15
        while True:
            found = {r["entry_key"]: (r["amount_minor"], r["source_id"]) for r in await conn.fetch(
                "SELECT * FROM ledger_entries WHERE user_id = $1", user or f"usr_{dep}")}
            if found == want or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        await conn.close()
    assert found == want


async def case_a(pipe: Running, dep: str) -> None:
    await correlate(pipe, dep)
    bodies = [deposit(dep, 7, "slip_received"), deposit(dep, 9, "settled"), deposit(dep, 6, "expired")]
    await post(pipe, *bodies)
    assert await outcomes(pipe, dep, 3) == ["applied", "applied", "stale"]
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM pg_deposits WHERE pg_deposit_id = $1", dep))
    assert (row["status"], row["pg_version"], row["credited_user_at"] is not None) == ("settled", 9, True)
    # slip_received takes the switch's default branch (a snapshot effect keyed on the event); the
    # stale expiry none (no show_late_slip)
    truth = deposit_truth(bodies)
    assert truth.effects == [f"evt_{dep}_v7:update_order_status", f"deposit:{dep}:credit_user",
                             f"deposit:{dep}:release_goods"]
    await delivered(pipe, dep, truth.effects)
    await ledger_matches(pipe, dep, {f"deposit:{dep}:credit_user": AMOUNT})


async def test_case_a_expired_after_settled(pipe: Running) -> None:
    await case_a(pipe, "dep_a")


async def test_case_b_settled_after_reversed(pipe: Running) -> None:
    await correlate(pipe, "dep_b")
    await post(pipe, deposit("dep_b", 12, "reversed"), deposit("dep_b", 9, "settled"))
    assert await outcomes(pipe, "dep_b", 2) == ["applied", "stale"]
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM pg_deposits WHERE pg_deposit_id = 'dep_b'"))
    assert (row["status"], row["credited_user_at"]) == ("reversed", None)
    # reversed without a credit debits nothing and holds nothing; the stale settlement credits nothing
    await delivered(pipe, "dep_b", [])
    await ledger_matches(pipe, "dep_b", {})


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
                                                  "pg_withdrawal_id = 'wdr_c' ORDER BY leg_ref"),
                                until=lambda rows: len(rows) == 3)
    assert [f["leg_ref"] for f in fills] == ["leg_c1", "leg_c2", "leg_c3"]
    await delivered(pipe, "wdr_c", ["withdrawal:wdr_c:close_payout"])


async def test_attribute_only_update_and_duplicate_delivery(pipe: Running) -> None:
    await correlate(pipe, "dep_d")
    settled = deposit("dep_d", 9, "settled")
    await post(pipe, settled, settled, deposit("dep_d", 10, "settled", note="attribute change"))
    assert await outcomes(pipe, "dep_d", 3) == ["applied", "duplicate", "applied"]
    row = await pipe.wait_for(lambda c: c.fetchrow(
        "SELECT * FROM pg_deposits WHERE pg_deposit_id = 'dep_d' AND pg_version = 10"))
    assert row["status"] == "settled"
    # the attribute change is applied and emits nothing: the one-shot effects are keyed on the deposit
    await delivered(pipe, "dep_d", ["deposit:dep_d:credit_user", "deposit:dep_d:release_goods"])
    await ledger_matches(pipe, "dep_d", {"deposit:dep_d:credit_user": AMOUNT})


async def test_late_slip_after_expiry(pipe: Running) -> None:
    await correlate(pipe, "dep_e")
    await post(pipe, deposit("dep_e", 6, "expired", event_id="evt_e6"), deposit("dep_e", 9, "settled"))
    assert await outcomes(pipe, "dep_e", 2) == ["applied", "applied"]
    await delivered(pipe, "dep_e", ["evt_e6:show_late_slip", "deposit:dep_e:credit_user",
                                    "deposit:dep_e:release_goods"])
    payload = await pipe.wait_for(lambda c: c.fetchval(
        "SELECT payload FROM effects WHERE dedupe_key = 'evt_e6:show_late_slip'"))
    assert orjson.loads(payload) == {"order_id": "ord_dep_e", "until": "2026-11-30T10:04:41Z"}
    await ledger_matches(pipe, "dep_e", {"deposit:dep_e:credit_user": AMOUNT})


async def test_expiry_and_cancellation_without_a_late_slip_fail_the_order(pipe: Running) -> None:
    """The document's expired/canceled branch: a terminal expiry (or no late_slip_accepted_until)
    fails the order, with cancel_reason_code or 'expired' as the reason; keyed on the event."""
    await correlate(pipe, "dep_x1")
    await correlate(pipe, "dep_x2")
    await post(pipe, deposit("dep_x1", 2, "pending"), deposit("dep_x1", 6, "expired", is_terminal=True),
               deposit("dep_x2", 6, "canceled", late_slip_accepted_until=None, cancel_reason_code="user_cancelled"))
    assert await outcomes(pipe, "dep_x1", 2) == ["applied", "applied"]
    assert await outcomes(pipe, "dep_x2", 1) == ["applied"]
    await delivered(pipe, "dep_x1", ["evt_dep_x1_v2:update_order_status", "evt_dep_x1_v6:fail_order"])
    await delivered(pipe, "dep_x2", ["evt_dep_x2_v6:fail_order"])
    conn = await pipe.connect()
    try:
        reasons = {r["dedupe_key"]: orjson.loads(r["payload"]) for r in await conn.fetch(
            "SELECT dedupe_key, payload FROM effects WHERE type = 'fail_order' AND resource_id = ANY($1)",
            ["dep_x1", "dep_x2"])}
    finally:
        await conn.close()
    assert reasons == {"evt_dep_x1_v6:fail_order": {"order_id": "ord_dep_x1", "reason": "expired"},
                       "evt_dep_x2_v6:fail_order": {"order_id": "ord_dep_x2", "reason": "user_cancelled"}}
    await ledger_matches(pipe, "dep_x1", {})


async def test_overpayment_flag_from_a_stale_event(pipe: Running) -> None:
    await correlate(pipe, "dep_f")
    flag = {"claim_id": "clm_f", "cause": "same_transfer_excess", "amount_minor": 2000,
            "slip_received_at": "2026-11-29T10:30:00Z", "status": "open", "action_required": "contact_support"}
    await post(pipe, deposit("dep_f", 12, "reversed"), deposit("dep_f", 11, "settled", overpayment=flag))
    assert await outcomes(pipe, "dep_f", 2) == ["applied", "stale"]
    row = await pipe.wait_for(lambda c: c.fetchrow(
        "SELECT * FROM pg_deposit_overpayment_flags WHERE claim_id = 'clm_f'"))
    assert (row["pg_deposit_id"], row["observed_deposit_version"], row["amount_minor"]) == ("dep_f", 11, 2000)
    await delivered(pipe, "dep_f", [])  # the flag is kept; the stale settlement still credits nothing


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
    await delivered(pipe, "dep_g", ["deposit:dep_g:credit_user", "deposit:dep_g:release_goods"])
    await ledger_matches(pipe, "dep_g", {"deposit:dep_g:credit_user": AMOUNT})
    status, body = await pipe.resource("pg", "dep_g")
    assert status == 200 and body["state"]["status"] == "settled" and body["parked"] == 0
    [delivery] = [d for d in body["timeline"] if d["event_type"] == "deposit.settled"]
    assert delivery["outcome"] == "unparked"
    assert sorted(e["type"] for e in delivery["effects"]) == ["credit_user", "release_goods"]


async def test_timeline_of_case_a(pipe: Running) -> None:
    await case_a(pipe, "dep_ta")  # its own deposit: the test runs alone or in any order
    status, body = await pipe.resource("pg", "dep_ta")
    assert status == 200
    assert (await pipe.resource("pg", "dep_nope"))[0] == 404
    assert body["state"]["pg_version"] == 9
    timeline = [(d["event_type"], d["outcome"], len(d["effects"])) for d in body["timeline"]]
    assert timeline == [("correlation.registered", "applied", 0), ("deposit.slip_received", "applied", 1),
                        ("deposit.settled", "applied", 2), ("deposit.expired", "stale", 0)]


def sequence_base() -> int:
    """A sequence number above every one an earlier test of the module sent: the sequence is global
    per merchant, so a gap opens only above the highest seen (microseconds since the epoch, which
    grow from one test to the next in whatever order they run)."""
    return time.time_ns() // 1000


async def test_sequence_gap_is_recorded_and_backfilled_after_the_limit(pipe: Running) -> None:
    await correlate(pipe, "dep_s")
    base = sequence_base()
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
        decided = await pipe.wait_for(lambda c: c.fetchval(
            "SELECT count(*) FROM webhook_events WHERE resource_id = $1 AND outcome <> 'parked' "
            "AND event_type <> 'correlation.registered' HAVING count(*) >= $2", dep, deliveries))
        assert decided == deliveries  # one decision per delivery, none twice
        # the posts are sequential, so the log order is ``order``; where the correlation stands
        # in it changes nothing (parked events are applied in log order)
        truth = deposit_truth([ev for ev in order if ev is not None])
        await delivered(pipe, dep, truth.effects)
        await ledger_matches(pipe, dep, truth.ledger)
        assert await balance(pipe, f"usr_{dep}") == (AMOUNT if final_status == "settled" else 0)

    asyncio.run(scenario())


async def test_a_gap_older_than_the_limit_is_backfilled_from_the_gateway(pipe: Running) -> None:
    await correlate(pipe, "dep_bf")
    base = sequence_base()
    withheld = [deposit("dep_bf", 2, "slip_received", sequence=base + 1),
                deposit("dep_bf", 3, "settled", sequence=base + 2)]
    API_EVENTS.extend(Emitted("pg", "dep_bf", body, 0) for body in withheld)  # the gateway has them; we never got them
    # one after the other: the two land on different partitions, and when this test runs first the
    # projector starts tracking at whichever number it sees first (a higher one would hide the gap)
    await post(pipe, deposit("dep_bf", 1, "pending", sequence=base))
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM pg_deposits WHERE pg_deposit_id = 'dep_bf'"))
    await post(pipe, deposit("dep_x", 1, "pending", sequence=base + 3))
    # 2 s later the gap is due: a backfill request, the fetcher asks the gateway, the events arrive
    row = await pipe.wait_for(lambda c: c.fetchrow(
        "SELECT * FROM pg_deposits WHERE pg_deposit_id = 'dep_bf' AND status = 'settled'"), timeout=90)
    assert row["pg_version"] == 3
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 0 FROM pg_sequence_gaps WHERE start_seq > $1 AND start_seq <= $2", base, base + 3))
    truth = deposit_truth([deposit("dep_bf", 1, "pending", sequence=base), *withheld])
    await delivered(pipe, "dep_bf", truth.effects)
    await ledger_matches(pipe, "dep_bf", {"deposit:dep_bf:credit_user": AMOUNT})
