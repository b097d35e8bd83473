"""The operator's bulk actions, JSON listings and timeline orders against a running pipeline on real
Kafka and PostgreSQL (issue #48 item 5; DESIGN.md §3.1, §6).

One scenario: a card payment whose authorisation arrived last (so its refund parked), two batches
of deposits whose effects died (the second after a recorded instant, for the time filter), an open
pg sequence gap, two card bodies of an unknown type set aside at the ingest and a correlation the
worker could not read. The tests run in file order on it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from app.admin import bulk
from app.producer import KeyedProducer
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.e2e.test_card_pipeline import card_event
from tests.e2e.test_effects_delivery import restart_effects, settle_deposits
from tests.pg_events import deposit
from tests.pipeline import Running, running_pipeline
from tests.support import admin_token, make_settings
from topics.catalog import names
from topics.records import correlation_headers

REF = "pay_bulk"
POISON = "poison-bulk"


@dataclass
class Scenario:
    pipe: Running
    first: list[str]  # dead effects made before ``middle``
    second: list[str]  # dead effects made after it
    middle: datetime


async def dead(pipe: Running, keys: list[str]) -> None:
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = $2 FROM effects WHERE dedupe_key = ANY($1) AND dead_at IS NOT NULL", keys, len(keys)))


async def set_up(pipe: Running) -> Scenario:
    await pipe.post("card", card_event(REF, "evt_c1", "captured", 1, 8000),
                    card_event(REF, "evt_r", "refunded", 2, 10000), card_event(REF, "evt_a", "authorised", 0, 12000))
    for n in range(2):
        answer = (await pipe.post("card", card_event(f"pay_unknown{n}", f"evt_u{n}", "disputed", 3, 500)))[0]
        assert answer.get("quarantined") is True, answer
    producer = KeyedProducer(pipe.settings.kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(names(pipe.settings.namespace).raw, b"pg:dep_poison", b"\xff not a correlation",
                                     correlation_headers("pg", POISON, int(time.time() * 1000)))
    finally:
        await producer.stop()
    await pipe.correlate(["dep_gap"])
    await pipe.post("pg", deposit("dep_gap", 1, "pending", sequence=3), deposit("dep_gap", 2, "pending", sequence=6))
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 1 FROM pg_sequence_gaps"))
    # what the scenario emitted so far (the card payment's mark_order_paid, dep_gap's two status
    # updates: the effects process may not have recorded the last yet) is delivered before the
    # merchant starts refusing
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 3 AND count(*) FILTER (WHERE delivered_at IS NULL) = 0 FROM effects"))
    restart_effects(pipe, ORDERLY_EFFECTS_MAX_ATTEMPTS="1")
    pipe.stub.behave(refuse_with=500)
    first = await settle_deposits(pipe, "early", 2)
    await dead(pipe, first)
    await asyncio.sleep(1.1)
    middle = datetime.now(UTC)
    await asyncio.sleep(1.1)
    second = await settle_deposits(pipe, "late", 2)
    await dead(pipe, second)
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 3 FROM quarantine"))
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 3 AND count(*) FILTER (WHERE outcome = 'parked') = 1 FROM webhook_events "
        "WHERE resource_id = $1", REF))
    return Scenario(pipe, first, second, middle)


@pytest.fixture(scope="module")
def scenario(kafka: KafkaBroker, postgres: PostgresServer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"op{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path_factory.mktemp("operator")) as pipe:
        yield asyncio.run(set_up(pipe))


@pytest.fixture
def env(scenario: Scenario, tmp_path: Path) -> dict[str, str]:
    """The commands' environment: only a running `orderly dev`'s stack.json names the stack."""
    pipe = scenario.pipe
    found = {k: v for k, v in os.environ.items() if not k.startswith("ORDERLY_")}
    found["ORDERLY_DATA_DIR"] = str(tmp_path)
    (tmp_path / "stack.json").write_text(json.dumps({
        "namespace": pipe.settings.namespace, "kafka_bootstrap": pipe.settings.kafka_bootstrap,
        "postgres_dsn": pipe.settings.postgres_dsn.reveal()}))
    return found


def orderly(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True,
                          timeout=90, check=False)


def orderly_json(env: dict[str, str], *args: str) -> Any:
    done = orderly(env, *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def admin_post(pipe: Running, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(
            f"{pipe.admin}{path}", headers={"Authorization": f"Bearer {admin_token(pipe.settings)}"}) as resp:
        return resp.status, await resp.json()


async def bulk_audit(pipe: Running, action: str) -> list[dict[str, Any]]:
    return list((await pipe.admin_get(f"/api/audit?action={action}"))[1]["items"])


async def dead_keys(pipe: Running) -> set[str]:
    conn = await pipe.connect()
    try:
        return {r["dedupe_key"] for r in await conn.fetch("SELECT dedupe_key FROM effects WHERE dead_at IS NOT NULL")}
    finally:
        await conn.close()


# --- --json on every listing ----------------------------------------------------------------------

def test_every_listing_command_prints_json(scenario: Scenario, env: dict[str, str]) -> None:
    parked = orderly_json(env, "parked", "--json")["items"]
    assert [(p["gateway"], p["resource_id"], p["deliveries"]) for p in parked] == [("card", REF, 1)]
    assert parked[0]["parked_since"].endswith("+00:00")  # ISO 8601 with its zone
    gaps = orderly_json(env, "gaps", "--json")["items"]
    assert [(g["start_seq"], g["end_seq"], g["missing"]) for g in gaps] == [(4, 5, 2)]
    listed = orderly_json(env, "quarantine", "list", "--json")["items"]
    assert sorted((q["stage"], q["gateway"]) for q in listed) == [("ingest", "card"), ("ingest", "card"),
                                                                   ("worker", "pg")]
    effects = orderly_json(env, "effects", "list", "--state", "dead", "--json")["items"]
    assert {e["dedupe_key"] for e in effects} == set(scenario.first + scenario.second)
    assert all(e["status"] == "dead" and isinstance(e["attempts"], int) for e in effects)
    shown = orderly_json(env, "inspect", "card", REF, "--json")
    assert shown["state"]["captured_minor"] == 8000 and shown["state"]["currency"] == "EUR"  # the raw integer
    made = orderly(env, "admin", "token", "create", "--name", "ci", "--role", "viewer", "--expires-days", "1")
    assert made.returncode == 0, made.stderr
    tokens = orderly_json(env, "admin", "token", "list", "--json")["items"]
    assert [(t["name"], t["role"]) for t in tokens] == [("ci", "viewer")]


# --- the timeline in both orders -----------------------------------------------------------------

async def test_the_timeline_in_gateway_order_marks_the_delivery_that_came_late(scenario: Scenario) -> None:
    pipe = scenario.pipe
    status, arrival = await pipe.admin_get(f"/api/resources/card/{REF}")
    assert status == 200 and arrival["order"] == "arrival" and arrival["late"] == 1
    assert [(d["event_id"], d["arrival"], d["gateway_position"], d["late"]) for d in arrival["timeline"]] == [
        ("evt_c1", 1, 2, False), ("evt_r", 2, 3, False), ("evt_a", 3, 1, True)]
    status, gateway = await pipe.admin_get(f"/api/resources/card/{REF}?order=gateway")
    assert status == 200 and [d["event_id"] for d in gateway["timeline"]] == ["evt_a", "evt_c1", "evt_r"]
    status, refused = await pipe.admin_get(f"/api/resources/card/{REF}?order=sideways")
    assert status == 400 and "order must be one of arrival, gateway" in refused["error"]


def test_inspect_prints_both_orders_with_amounts_and_zoned_times(scenario: Scenario, env: dict[str, str]) -> None:
    arrival = orderly(env, "inspect", "card", REF)
    assert arrival.returncode == 0, arrival.stderr
    assert "captured_minor: 8000 (80.00 EUR)" in arrival.stdout and "late=1" in arrival.stdout
    rows = [line for line in arrival.stdout.splitlines() if "payment." in line]
    assert [r.split()[0] for r in rows] == ["1", "2", "3"] and "1 late" in rows[2] and "120.00 EUR" in rows[2]
    assert all(re.search(r"\s\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\s", r) for r in rows), rows  # received at
    gateway = orderly(env, "inspect", "card", REF, "--order", "gateway")
    events = re.findall(r"payment\.\w+", gateway.stdout)
    assert events == ["payment.authorised", "payment.captured", "payment.refunded"], gateway.stdout


# --- bulk retry and redrive ------------------------------------------------------------------------

async def test_a_dry_run_counts_and_changes_nothing(scenario: Scenario, env: dict[str, str]) -> None:
    pipe = scenario.pipe
    status, body = await admin_post(pipe, "/api/effects/retry?dry_run=true&gateway=pg")
    assert status == 200, body
    every = len(scenario.first) + len(scenario.second)
    assert (body["dry_run"], body["matched"], body["acted"], body["most_per_call"]) == (True, every, 0, 1000)
    since = scenario.middle.isoformat()
    cli = await asyncio.to_thread(orderly_json, env, "effects", "retry", "--gateway", "pg", "--since", since,
                                  "--dry-run", "--json")
    assert (cli["matched"], cli["acted"], cli["dry_run"]) == (len(scenario.second), 0, True)
    status, body = await admin_post(pipe, "/api/quarantine/redrive?dry_run=true&stage=ingest")
    assert status == 200 and body["matched"] == 2, body
    assert await dead_keys(pipe) == set(scenario.first + scenario.second)
    assert not await bulk_audit(pipe, "effects.retry.bulk") and not await bulk_audit(pipe, "quarantine.redrive.bulk")


async def test_a_bad_filter_is_refused_naming_it(scenario: Scenario, env: dict[str, str]) -> None:
    pipe = scenario.pipe
    for query, named in (("since=yesterday", "since must be ISO 8601"), ("limit=5000", "limit must be"),
                         ("state=delivered", "state must be one of dead, pending"), ("dry_run=maybe", "dry_run")):
        status, body = await admin_post(pipe, f"/api/effects/retry?{query}")
        assert status == 400 and named in body["error"], (query, body)
    done = await asyncio.to_thread(orderly, env, "effects", "retry", "--since", "2026-11-29T10:00:00")
    assert done.returncode == 1 and "since must name its zone" in done.stderr and "Traceback" not in done.stderr
    assert await dead_keys(pipe) == set(scenario.first + scenario.second)


async def test_effects_retried_by_time_range_are_delivered_once_and_audited_once_a_call(
        scenario: Scenario, env: dict[str, str]) -> None:
    pipe = scenario.pipe
    pipe.stub.behave()  # the merchant answers again
    since = scenario.middle.isoformat().replace("+00:00", "Z")
    status, body = await admin_post(pipe, f"/api/effects/retry?since={since}&limit=3")
    assert status == 200, body
    assert (body["matched"], body["acted"], body["dry_run"]) == (4, 3, False)
    # the rest of the filter in a second call, from the command line
    rest = await asyncio.to_thread(orderly_json, env, "effects", "retry", "--since", since, "--json")
    assert (rest["matched"], rest["acted"]) == (1, 1), rest
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = $2 FROM effects WHERE dedupe_key = ANY($1) AND delivered_at IS NOT NULL",
        scenario.second, len(scenario.second)))
    assert [pipe.stub.deliveries[k] for k in scenario.second] == [1] * len(scenario.second)
    assert await dead_keys(pipe) == set(scenario.first)  # before the instant: untouched
    audit = await bulk_audit(pipe, "effects.retry.bulk")
    assert [(a["result"], a["actor"].split("@")[0].split(":")[0]) for a in reversed(audit)] == [
        ("3 of 4 matched back to pending", "break-glass"), ("1 of 1 matched back to pending", "cli")]
    assert all(f"since={since}" in a["target"] for a in audit)


async def test_quarantined_records_are_redriven_by_filter_with_one_audit_row(
        scenario: Scenario, env: dict[str, str]) -> None:
    pipe = scenario.pipe
    status, body = await admin_post(pipe, "/api/quarantine/redrive?stage=worker&gateway=pg")
    assert status == 200, body
    assert (body["matched"], body["acted"], body["refused"]) == (1, 1, 0)
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 1 FROM quarantine WHERE delivery_id = $1", f"{POISON}~r1"))
    # bodies the card adapter still refuses: counted, left, and said why, in one row
    refused = await asyncio.to_thread(orderly_json, env, "quarantine", "redrive", "--gateway", "card", "--json")
    assert (refused["matched"], refused["acted"], refused["refused"]) == (2, 0, 2), refused
    assert "still refused by the card adapter" in refused["result"]
    audit = await bulk_audit(pipe, "quarantine.redrive.bulk")
    assert [a["result"].split(";")[0] for a in reversed(audit)] == [
        "1 of 1 matched redriven", "0 of 2 matched redriven"]
    assert [a["target"] for a in reversed(audit)] == [
        "state=waiting gateway=pg stage=worker limit=1000", f"state=waiting gateway=card limit={bulk.MOST_PER_CALL}"]
    again = await asyncio.to_thread(orderly_json, env, "quarantine", "redrive", "--stage", "worker", "--dry-run",
                                    "--json")
    assert again["matched"] == 1  # the new delivery the worker set aside again; the original is redriven
