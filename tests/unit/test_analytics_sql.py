"""docs/analytics/delivery_order.sql over a Parquet file laid out as `orderly export` writes it, from
the decisions the real core makes for seeded histories of every gateway (no Kafka): the SQL's
counts against counts computed here from the same decisions, with records written twice (as a
re-decided batch is) changing nothing."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow.parquet as pq

from app.core.dispatch import plan_batch
from app.export import Batch, layout, published
from app.gateways.registry import GATEWAYS
from app.simulator import check, truths
from topics.catalog import names

SQL = Path(__file__).resolve().parents[2] / "docs" / "analytics" / "delivery_order.sql"
PARKS_FOR_ORDER = {"card", "adyen", "paymos"}
GATEWAYS_SEEN = ("adyen", "card", "paymos", "pg", "stripe")


def stored(store: dict[bytes, bytes], _partition: int, key: bytes) -> bytes | None:
    return store.get(key)


def decisions() -> list[dict[str, Any]]:
    out = []
    for gateway in GATEWAYS_SEEN:
        for seed in range(8):
            store: dict[bytes, bytes] = {}
            batch = check.records(truths.make(gateway, seed, "sql"))
            for start in range(0, len(batch), 7):
                plan = plan_batch(check.TOPICS, GATEWAYS, batch[start:start + 7], partial(stored, store))
                store.update(plan.states)
                out += [orjson.loads(r[2]) for rs in plan.records.values() for r in rs
                        if r[0] == check.TOPICS.decisions]
    return out


def write_parquet(records: list[dict[str, Any]], target: Path) -> None:
    shape = layout(names().decisions, published())
    batch = Batch(shape)
    for offset, value in enumerate(records):
        batch.add("decisions", 0, offset, 0, f"{value['gateway']}:{value['resource_id']}", value)
    with pq.ParquetWriter(target, shape.schema) as writer:
        writer.write_table(batch.table(), row_group_size=1000)


def expected(records: list[dict[str, Any]]) -> dict[tuple[str, str], Counter[str]]:
    """The definitions of the SQL file's header, computed in Python."""
    by_resource: dict[tuple[str, str], dict[tuple[str, int, str], dict[str, Any]]] = {}
    for d in records:
        by_resource.setdefault((d["gateway"], d["resource_id"]), {})[(d["delivery_id"], d["seq"], d["outcome"])] = d
    counts: dict[tuple[str, str], Counter[str]] = {}
    for (gateway, _rid), decided in by_resource.items():
        ordered = sorted(decided.values(), key=lambda d: d["seq"])
        released: dict[str, int] = {}
        for i, d in enumerate(ordered):
            if d["outcome"] == "unparked":
                trigger = [t for t in ordered[:i] if t["outcome"] != "unparked"]
                if trigger:
                    released[d["delivery_id"]] = trigger[-1]["received_at_ms"]
        for delivery in {d["delivery_id"] for d in ordered if d["event_type"] != "correlation.registered"}:
            mine = [d for d in ordered if d["delivery_id"] == delivery]
            last, parked = mine[-1]["outcome"], any(d["outcome"] == "parked" for d in mine)
            day = datetime.fromtimestamp(min(d["received_at_ms"] for d in mine) / 1000, UTC).date().isoformat()
            c = counts.setdefault((gateway, day), Counter())
            c.update(deliveries=1, parked=parked, still_parked=parked and last == "parked", stale=last == "stale",
                     duplicate=last == "duplicate", fetched=any(d["outcome"] == "synced" for d in mine),
                     out_of_order=last == "stale" or (parked and delivery in released and gateway in PARKS_FOR_ORDER))
    return counts


def test_the_example_sql_counts_what_the_core_decided(tmp_path: Path) -> None:
    records = decisions()
    twice = [r for i, r in enumerate(records) for _ in range(2 if i % 5 == 0 else 1)]  # re-decided batches
    target = tmp_path / "decisions.parquet"
    started = time.perf_counter()
    write_parquet(twice, target)
    elapsed = time.perf_counter() - started
    db = duckdb.connect()
    db.execute(f"CREATE VIEW decisions AS SELECT * FROM read_parquet('{target}')")
    result = db.execute(SQL.read_text())
    header = [d[0] for d in result.description]
    got = {(row[0], row[1].isoformat()): Counter({k: v for k, v in zip(header, row, strict=True)
                                                  if k in ("deliveries", "out_of_order", "parked", "still_parked",
                                                           "fetched", "stale", "duplicate") and v})
           for row in result.fetchall()}
    want = {key: Counter({k: v for k, v in c.items() if v}) for key, c in expected(records).items()}
    assert got == want
    totals = sum(want.values(), Counter())
    # the histories reach every measure, so none of the SQL's columns goes untested
    assert all(totals[k] > 0 for k in ("out_of_order", "parked", "fetched", "stale", "duplicate")), totals
    assert {g for g, _ in got} == set(GATEWAYS_SEEN)
    print(f"{len(twice)} decisions to Parquet in {elapsed:.3f} s ({len(twice) / elapsed:,.0f} rows/s, no Kafka)")
