"""`orderly export` and the DuckDB worked example (docs/analytics/delivery_order.sql) on data made
by the real pipeline: card payments and pg withdrawals delivered out of order, duplicated, and one
card payment whose authorisation never comes (fetched from the card API); the SQL's counts per
gateway and day are compared with counts this test computes from what it sent."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import duckdb
import orjson
import pyarrow.parquet as pq
import pytest

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.card_api import CardApi, answer, serve_card_api
from tests.pg_events import withdrawal
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings, read_topic
from topics.catalog import names

SQL = Path(__file__).resolve().parents[2] / "docs" / "analytics" / "delivery_order.sql"
PAYMENTS = WITHDRAWALS = 10
FETCH_AFTER_S = 2.0


@pytest.fixture(scope="module")
def gateway() -> Iterator[CardApi]:
    with serve_card_api() as api:
        yield api


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, gateway: CardApi,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"an{uuid.uuid4().hex[:8]}", api_urls={"card": gateway.url},
                      fetch_parked_after_s=FETCH_AFTER_S, fetch_interval_s=0.5)
    with running_pipeline(s, tmp_path_factory.mktemp("analytics")) as running:
        yield running


def card_event(ref: str, kind: str, second: int) -> bytes:
    return orjson.dumps({"id": f"{ref}_{kind}", "type": f"payment.{kind}", "payment_ref": ref, "sequence": None,
                         "occurred_at": f"2026-11-29T10:02:{15 + second:02d}.123Z", "amount_minor": 9000,
                         "currency": "EUR"})


def run_export(pipe: Running, topic: str, target: Path) -> float:
    """`orderly export` as an operator runs it; its rows per second."""
    done = subprocess.run([sys.executable, "-m", "app.cli", "export", "--topic", topic, "--to", str(target),
                           "--row-group", "25"], env=pipe.pipeline.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = re.search(r"\(([\d,]+) rows/s\)", done.stdout)
    assert found, done.stdout
    return float(found.group(1).replace(",", ""))


async def test_the_duckdb_example_counts_what_was_sent(pipe: Running, gateway: CardApi, tmp_path: Path) -> None:
    expected = {g: Counter[str]() for g in ("card", "pg")}
    for i in range(PAYMENTS):  # odd payments: the capture before its authorisation (parked, then released)
        ref = f"pay_{i}"
        order = ["captured", "authorised"] if i % 2 else ["authorised", "captured"]
        await pipe.post("card", *(card_event(ref, kind, second) for second, kind in enumerate(order)))
        expected["card"].update(deliveries=2, out_of_order=i % 2, parked=i % 2)
        if i % 3 == 0:  # the gateway retries a delivery it had sent
            await pipe.post("card", card_event(ref, "authorised", 0))
            expected["card"].update(deliveries=1, duplicate=1)
    for j in range(WITHDRAWALS):  # odd withdrawals: the newest version first, the older two are stale
        wdr = f"wdr_{j}"
        versions = [3, 1, 2] if j % 2 else [1, 2, 3]
        await pipe.post("pg", *(withdrawal(wdr, v, "settled" if v == 3 else "filling", 100_000 * v)
                                for v in versions))
        expected["pg"].update(deliveries=3, out_of_order=2 * (j % 2), stale=2 * (j % 2))
        if j % 4 == 0:
            await pipe.post("pg", withdrawal(wdr, 3, "settled", 300_000))
            expected["pg"].update(deliveries=1, duplicate=1)
    # a capture whose authorisation never arrives: parked until the fetcher's answer releases it
    gateway.payments["pay_fetch"] = answer("pay_fetch", "captured", 9000, 9000, 0)
    await pipe.post("card", card_event("pay_fetch", "captured", 1))
    expected["card"].update(deliveries=1, out_of_order=1, parked=1)

    webhooks = sum(c["deliveries"] for c in expected.values())
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = $1 FROM webhook_events WHERE outcome <> 'synced'", webhooks))
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 0 FROM webhook_events WHERE outcome = 'parked'"), timeout=60)
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) FROM webhook_events WHERE outcome = 'synced'"))
    # every answer the API gave is appended as a fetched event: the first applies, any later one repeats it
    answered = gateway.answers["pay_fetch"].count(200)
    expected["card"].update(deliveries=answered, fetched=1, duplicate=answered - 1)
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = $1 FROM webhook_events WHERE gateway = 'card'", expected["card"]["deliveries"]))

    n = names(pipe.settings.namespace)
    files = {topic: tmp_path / f"{topic}.parquet" for topic in ("decisions", "state", "facts", "effects")}
    rates = {topic: run_export(pipe, topic, path) for topic, path in files.items()}
    decisions = pq.ParquetFile(files["decisions"])
    in_topic = await read_topic(pipe.settings.kafka_bootstrap, n.decisions)
    assert decisions.metadata.num_rows == len(in_topic) and decisions.num_row_groups >= len(in_topic) // 25
    assert json.loads(decisions.schema_arrow.metadata[b"orderly.schemas"])
    for topic in ("state", "facts", "effects"):
        assert pq.ParquetFile(files[topic]).metadata.num_rows == len(
            await read_topic(pipe.settings.kafka_bootstrap, getattr(n, topic))), topic
    print(f"export rows/s: {rates} ({len(in_topic)} decisions)")

    db = duckdb.connect()
    db.execute(f"CREATE VIEW decisions AS SELECT * FROM read_parquet('{files['decisions']}')")
    result = db.execute(SQL.read_text())
    header = [d[0] for d in result.description]
    rows = [dict(zip(header, row, strict=True)) for row in result.fetchall()]
    print(header, *rows, sep="\n")  # the table docs/analytics.md shows
    got = {g: Counter[str]() for g in expected}
    for row in rows:
        got[row["gateway"]].update({k: row[k] for k in ("deliveries", "out_of_order", "parked", "still_parked",
                                                        "fetched", "stale", "duplicate")})
    for g in expected:
        keys = ("deliveries", "out_of_order", "parked", "still_parked", "fetched", "stale", "duplicate")
        assert {k: got[g][k] for k in keys} == {k: expected[g][k] for k in keys}, (g, rows)
    card = [r for r in rows if r["gateway"] == "card"]
    # the fetched one waited at least the fetcher's threshold; the others a moment
    assert max(r["parked_wait_ms_max"] for r in card) >= FETCH_AFTER_S * 1000
    assert all(0 <= r["parked_wait_ms_p50"] <= r["parked_wait_ms_max"] for r in card)
