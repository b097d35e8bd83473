"""`orderly projector`: writes the PostgreSQL read models from ``orderly.decisions`` (I/O layer).

Each batch is one transaction that writes the rows *and* the consumed offsets, and every row write
repeats the guard (``WHERE version < EXCLUDED.version``, ``ON CONFLICT DO NOTHING`` for append-only
facts), so a record delivered again after a crash or a rebalance changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson

from app.core.gaps import Gap, due_for_backfill, observe
from app.gateways import registry
from app.kafka_client import client_options
from app.metrics import ProjectorMetrics, every, serve_metrics
from app.producer import KeyedProducer
from app.settings import Settings
from app.sink import PgSink
from projections import quarantine, sql
from projections.bulk import Conn, write
from topics.catalog import names
from topics.records import DECISIONS, Decision

log = logging.getLogger("orderly.projector")
CONSUMER = "projector"
GAUGES_EVERY_S = 5.0  # how often the parked, quarantine and lag gauges are read
STAGES = ("ingest", "worker", "projector", "effects", "fetcher")  # what sets records aside (DESIGN.md §2.4)
# Per gateway: resources holding parked deliveries, the deliveries, the age of the oldest (the
# partial index webhook_events_parked holds exactly these rows).
PARKED_BY_GATEWAY = """
SELECT gateway, count(DISTINCT resource_id) AS resources, count(*) AS events,
       coalesce(extract(epoch FROM now() - min(received_at)), 0)::float8 AS oldest_s
  FROM webhook_events WHERE outcome = 'parked' GROUP BY gateway"""
QUARANTINED_BY_STAGE = "SELECT stage, count(*) AS records FROM quarantine WHERE redriven_at IS NULL GROUP BY stage"


def _ms_to_ts(ms: int) -> Any:
    return datetime.fromtimestamp(ms / 1000, UTC)  # once per decision: the import is the module's


async def project(conn: Conn, decisions: Sequence[Decision], metrics: ProjectorMetrics) -> None:
    """Write one batch of decisions (already in log order) inside the caller's transaction.

    One statement per table, in an order that satisfies the foreign keys (rows before the fills
    and flags that reference them); within a table the log order is kept, so the SQL guard sees
    a resource's snapshots in the order the worker decided them.
    """
    await write(conn, sql.WEBHOOK_EVENTS, [
        (d.delivery_id, d.gateway, d.event_id, d.resource_id, d.event_type,
         _ms_to_ts(d.received_at_ms), d.outcome, orjson.dumps(d.payload).decode(), d.seq, d.error)
        for d in decisions])
    facts = [f for d in decisions for f in d.facts]
    await write(conn, sql.CORRELATIONS, [
        (c["pg_deposit_id"], c["merchant_reference"], c["our_order_id"], c["our_user_id"])
        for c in (f.data for f in facts if f.kind == "correlation")])
    rows: dict[str, list[list[Any]]] = {}
    for d in decisions:
        if d.row is not None and d.table is not None:
            rows.setdefault(d.table, []).append(sql.row_args(d.table, d.row))
    for table, args in rows.items():
        await write(conn, sql.UPSERT_ROW[table], args)
    await write(conn, sql.FILLS, [
        (f["leg_ref"], f["pg_withdrawal_id"], f.get("sequence"), f["amount_minor"], f.get("fee_recognized_minor"),
         f.get("settled_at"), f.get("auto_confirm_at"), f.get("balance_transaction_id"))
        for f in (f.data for f in facts if f.kind == "withdrawal_fill")])
    await write(conn, sql.CARD_EVENTS, [
        (e["gateway_event_id"], e["payment_ref"], e["event_type"], e["sequence"], e["occurred_at"],
         e["received_at"], e["payload"].encode(), e["source"])
        for e in (f.data for f in facts if f.kind == "card_event")])
    applied = [(f.data["gateway_event_id"], f.data["applied_at"]) for f in facts if f.kind == "card_event_applied"]
    if applied:
        await conn.executemany(sql.MARK_CARD_EVENT_APPLIED, applied)
    await write(conn, sql.NOTES, [(n["note_key"], n["resource_id"], n["kind"], n["body"])
                                  for n in (f.data for f in facts if f.kind == "order_note")])
    for fact in facts:
        if fact.kind == "overpayment_flag":
            await _flag(conn, fact.data, metrics)
    await write(conn, sql.LEDGER, [
        (e.dedupe_key, e.payload["user_id"],
         (1 if e.type == "credit_user" else -1) * e.payload["amount_minor"], e.resource_id)
        for d in decisions for e in d.effects if e.type in ("credit_user", "debit_user")])
    for d in decisions:
        if d.error:
            metrics.errors.inc()
            await conn.execute(sql.INSERT_ERROR, "decision", d.delivery_id,
                               orjson.dumps({"error": d.error, "resource": d.resource_id}).decode())


async def _flag(conn: Conn, data: dict[str, Any], metrics: ProjectorMetrics) -> None:
    flag = data["flag"]
    args = (data["claim_id"], data["pg_deposit_id"], data["observed_deposit_version"], flag.get("cause"),
            flag.get("amount_minor"), flag.get("slip_received_at"), flag.get("status"),
            flag.get("action_required"), flag.get("expected_response_at"), orjson.dumps(flag).decode())
    if await conn.fetchval(sql.INSERT_FLAG, *args) is not None:
        return
    # Already there: the same claim from a newer snapshot is fine; other content never is.
    if not await conn.fetchval(sql.SAME_FLAG, args[0], args[1], *args[3:]):
        metrics.errors.inc()
        log.error("overpayment claim_id collision: %s", data["claim_id"])
        await conn.execute(sql.INSERT_ERROR, "overpayment_claim_collision", data["claim_id"],
                           orjson.dumps(data).decode())


def _gaps(rows: list[asyncpg.Record]) -> list[Gap]:
    return [Gap(r["start_seq"], r["end_seq"], int(r["first_seen_at"].timestamp() * 1000),
                r["backfill_requested_at"] is not None) for r in rows]


async def observe_sequences(conn: Conn, decisions: Sequence[Decision],
                            metrics: ProjectorMetrics) -> None:
    seen = [(d.sequence, d.received_at_ms) for d in decisions
            if d.gateway == "pg" and d.sequence is not None and d.outcome != "quarantined"]
    if not seen:
        return
    await conn.execute(sql.LOCK_SEQUENCES)
    max_seen = await conn.fetchval(sql.SELECT_SEQUENCE_MAX)
    rows = await conn.fetch(sql.SELECT_GAPS)
    gaps = before = _gaps(rows)
    start_max = max_seen
    for seq, at_ms in seen:
        max_seen, gaps = observe(max_seen, gaps, seq, at_ms)
    if max_seen != start_max:
        await conn.execute(sql.UPSERT_SEQUENCE_MAX, max_seen)
    if gaps != before:
        # write only what changed: a burst can leave thousands of gaps open
        old, new = set(before), set(gaps)
        requested = {r["start_seq"]: r["backfill_requested_at"] for r in rows}

        def requested_at(g: Gap) -> Any:
            parent = next((b for b in before if b.start <= g.start and g.end <= b.end), None)
            return requested.get(parent.start) if parent is not None else None

        if old - new:
            await conn.execute(sql.DELETE_GAPS, [g.start for g in old - new])
        await write(conn, sql.GAPS, [("pg", g.start, g.end, _ms_to_ts(g.first_seen_ms), requested_at(g))
                                     for g in sorted(new - old, key=lambda g: g.start)])
    metrics.gaps_open.set(len(gaps))
    metrics.sequences_missing.set(sum(g.missing for g in gaps))


class Projector:
    """orderly.decisions → read models, ledger entries, timeline and sequence gaps."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.n = names(settings.namespace)
        self.metrics = ProjectorMetrics()
        self.sink = PgSink(settings, CONSUMER, self.n.decisions, self._apply, set_aside=self._set_aside)
        # orderly.quarantine -> the quarantine table; what it cannot store stays in projection_errors
        # only, never in orderly.quarantine again (that would loop)
        self.quarantine = PgSink(settings, "quarantine", self.n.quarantine, quarantine.record)
        self.producer = KeyedProducer(settings.kafka_bootstrap, **client_options(settings))

    async def _set_aside(self, message: Any, reason: str) -> None:
        record = quarantine.set_aside_record(self.n, CONSUMER, message, reason)
        await self.producer.send_and_wait(*record)
        self.metrics.set_aside.labels(CONSUMER, dict(record[3]).get("gateway", b"").decode() or "unknown").inc()

    async def _apply(self, conn: Conn, messages: list[Any]) -> None:
        started = time.perf_counter()
        decisions = [DECISIONS.decode(m.value) for m in messages]
        await project(conn, decisions, self.metrics)
        await observe_sequences(conn, decisions, self.metrics)
        self.metrics.projected.inc(len(decisions))
        now_ms = time.time() * 1000
        for d in decisions:
            if d.received_at_ms:
                self.metrics.lag_seconds.observe(max(0.0, now_ms - d.received_at_ms) / 1000)
        self.metrics.batch_seconds.observe(time.perf_counter() - started)

    async def start(self) -> None:
        await self.producer.start()
        await self.sink.start()
        await self.quarantine.start()

    async def stop(self) -> None:
        await self.quarantine.stop()
        await self.sink.stop()
        await self.producer.stop()

    async def run_once(self, timeout_ms: int = 200) -> int:
        await self.quarantine.run_once(timeout_ms=0)  # what has arrived; decisions are the ones worth a wait
        return await self.sink.run_once(timeout_ms)

    async def read_gauges(self) -> None:
        """The gauges read from PostgreSQL and Kafka: parked deliveries per gateway, quarantined
        records per stage, and both sinks' consumer lag. Every gateway and stage is set, 0 when it
        has none, so that an alert sees the value fall back, not the series vanish."""
        pool = self.sink.pool
        assert pool is not None
        m = self.metrics
        parked = {r["gateway"]: r for r in await pool.fetch(PARKED_BY_GATEWAY)}
        for gateway in sorted(set(registry.GATEWAYS) | set(parked)):
            row = parked.get(gateway)
            m.parked_resources.labels(gateway).set(row["resources"] if row else 0)
            m.parked_events.labels(gateway).set(row["events"] if row else 0)
            m.parked_oldest_s.labels(gateway).set(row["oldest_s"] if row else 0.0)
        quarantined = {r["stage"]: r["records"] for r in await pool.fetch(QUARANTINED_BY_STAGE)}
        for stage in sorted(set(STAGES) | set(quarantined)):
            m.quarantine_records.labels(stage).set(quarantined.get(stage, 0))
        for sink in (self.sink, self.quarantine):
            m.consumer_lag.labels(sink.name, sink.topic).set(await sink.lag())

    async def request_backfills(self) -> int:
        """Emit one fetch request per gap open longer than the limit (default 4 days)."""
        pool = self.sink.pool
        assert pool is not None
        now_ms = int(time.time() * 1000)
        after_ms = int(self.settings.gap_backfill_after_s * 1000)
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(sql.LOCK_SEQUENCES)
            gaps = _gaps(await conn.fetch(sql.SELECT_GAPS))
            due = due_for_backfill(gaps, now_ms, after_ms)
            for gap in due:
                request = {"gateway": "pg", "kind": "backfill", "since_sequence": gap.start - 1,
                           "until_sequence": gap.end, "gap_first_seen_ms": gap.first_seen_ms}
                await self.producer.send_and_wait(self.n.fetch, f"pg:sequence:{gap.start}".encode(),
                                                  orjson.dumps(request))
                await conn.execute(sql.MARK_BACKFILL_REQUESTED, gap.start)
            self.metrics.backfills.inc(len(due))
        return len(due)


async def run(settings: Settings) -> None:
    projector = Projector(settings)
    # Everything started is stopped in reverse order however the run ends, a SIGTERM during the
    # start included: a consumer that joined its group leaves it (app/cli.until_terminated).
    async with contextlib.AsyncExitStack() as started:
        started.push_async_callback(projector.stop)
        await projector.start()
        if settings.metrics_port:
            runner = await serve_metrics(projector.metrics.registry, settings.metrics_port, settings.metrics_host)
            started.push_async_callback(runner.cleanup)
        gauges = asyncio.create_task(every(GAUGES_EVERY_S, projector.read_gauges, "the projector's gauges"))
        started.callback(gauges.cancel)
        last_check = 0.0
        while True:
            await projector.run_once()
            if time.monotonic() - last_check > min(30.0, settings.gap_backfill_after_s / 2):
                last_check = time.monotonic()
                await projector.request_backfills()


