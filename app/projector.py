"""`orderly projector`: writes the PostgreSQL read models from ``orderly.decisions`` (I/O layer).

Each batch is one transaction that writes the rows *and* the consumed offsets, and every row write
repeats the guard (``WHERE version < EXCLUDED.version``, ``ON CONFLICT DO NOTHING`` for append-only
facts), so a record delivered again after a crash or a rebalance changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec
import orjson

from app.core.gaps import Gap, backfill_request, due_for_backfill, observe_all
from app.gateways import registry
from app.gateways.limits import long_numbers
from app.kafka_client import client_options
from app.metrics import ProjectorMetrics, beside, every, start_service
from app.producer import KeyedProducer
from app.readiness import UNREACHABLE, Readiness, wait_for_postgres
from app.settings import Settings
from app.sink import PgSink
from projections import quarantine, sql
from projections.bulk import Bulk, Conn, write
from projections.facts import FACTS, FactWrite
from topics.catalog import names
from topics.records import PROJECTED, ProjectedDecision

log = logging.getLogger("orderly.projector")
CONSUMER = "projector"
GAUGES_EVERY_S = 5.0  # how often the parked, quarantine, gap and lag gauges are read
# Backfill requests sent per pass (the rest the next pass): a sequence with many gaps open does not
# hold the projector's loop while it sends them all.
BACKFILLS_PER_PASS = 1000
STAGES = ("ingest", "worker", "projector", "effects", "fetcher")  # what sets records aside (DESIGN.md §2.4)
# Per gateway: resources holding parked deliveries, the deliveries, the age of the oldest (the
# partial index webhook_events_parked holds exactly these rows).
PARKED_BY_GATEWAY = """
SELECT gateway, count(DISTINCT resource_id) AS resources, count(*) AS events,
       coalesce(extract(epoch FROM now() - min(received_at)), 0)::float8 AS oldest_s,
       count(DISTINCT resource_id) FILTER (WHERE received_at < now() - make_interval(secs => $1)) AS overdue
  FROM webhook_events WHERE outcome = 'parked' GROUP BY gateway"""
QUARANTINED_BY_STAGE = "SELECT stage, count(*) AS records FROM quarantine WHERE redriven_at IS NULL GROUP BY stage"


def _payload_json(payload: msgspec.Raw, exact: bool = True) -> str:
    """The body as jsonb takes it: the JSON text the decision holds (the body's bytes as received), not
    read and written again; but read and written again (its numbers as the log's readers read them,
    doubles), as the projector did before it kept the text, where jsonb could refuse a number as
    written (limits.long_numbers: a refusal would set the whole decision aside) or the database's
    encoding is not UTF-8 (``exact`` False: jsonb refuses an escape of a character it cannot hold)."""
    text = bytes(payload)
    if exact and not long_numbers(text):
        return text.decode()
    return _encode(_decode(text)).decode()


_decode = msgspec.json.Decoder(float_hook=float).decode
_encode = msgspec.json.Encoder().encode


def _ms_to_ts(ms: int) -> Any:
    return datetime.fromtimestamp(ms / 1000, UTC)  # once per decision: the import is the module's


async def project(conn: Conn, decisions: Sequence[ProjectedDecision], metrics: ProjectorMetrics,
                  exact: bool = True) -> None:
    """Write one batch of decisions (already in log order) inside the caller's transaction.

    One statement per table, in an order that satisfies the foreign keys (rows before the fills
    and flags that reference them); within a table the log order is kept, so the SQL guard sees
    a resource's snapshots in the order the worker decided them. The facts are written as
    projections/facts.py says, in the order of the gateways' registry lines.
    """
    await write(conn, sql.WEBHOOK_EVENTS, [
        (d.delivery_id, d.gateway, d.event_id, d.resource_id, d.event_type,
         _ms_to_ts(d.received_at_ms), d.outcome, _payload_json(d.payload, exact), d.seq, d.error)
        for d in decisions])
    facts: dict[str, list[dict[str, Any]]] = {}
    for d in decisions:
        for f in d.facts:
            facts.setdefault(f.kind, []).append(f.data)
    kinds = [kind for gateway in registry.GATEWAYS.values() for kind in gateway.facts if kind in facts]
    for kind in kinds:
        if FACTS[kind].before_rows:
            await _write_facts(conn, FACTS[kind], facts[kind], metrics)
    rows: dict[str, list[list[Any]]] = {}
    for d in decisions:
        if d.row is not None and d.table is not None:
            rows.setdefault(d.table, []).append(sql.row_args(d.table, d.row))
    for table, args in rows.items():
        await write(conn, sql.UPSERT_ROW[table], args)
    for kind in kinds:
        if not FACTS[kind].before_rows:
            await _write_facts(conn, FACTS[kind], facts[kind], metrics)
    await write(conn, sql.LEDGER, [
        (e.dedupe_key, e.payload["user_id"],
         (1 if e.type == "credit_user" else -1) * e.payload["amount_minor"], e.resource_id)
        for d in decisions for e in d.effects if e.type in ("credit_user", "debit_user")])
    for d in decisions:
        if d.error:
            metrics.errors.inc()
            await conn.execute(sql.INSERT_ERROR, "decision", d.delivery_id,
                               orjson.dumps({"error": d.error, "resource": d.resource_id}).decode())


async def _write_facts(conn: Conn, how: FactWrite, data: list[dict[str, Any]], metrics: ProjectorMetrics) -> None:
    if isinstance(how.statement, Bulk):
        await write(conn, how.statement, [how.args(f) for f in data])
    elif how.update:
        await conn.executemany(how.statement, [how.args(f) for f in data])
    else:
        for fact in data:
            args = how.args(fact)
            if await conn.fetchval(how.statement, *args) is not None or how.same is None:
                continue
            # Already there: the same content is fine; other content under the same key never is.
            if not await conn.fetchval(how.same, *how.same_args(args)):
                metrics.errors.inc()
                log.error("%s: %s", how.collision, args[0])
                await conn.execute(sql.INSERT_ERROR, how.collision, args[0], orjson.dumps(fact).decode())


def _gaps(rows: list[asyncpg.Record]) -> list[Gap]:
    return [Gap(r["start_seq"], r["end_seq"], int(r["first_seen_at"].timestamp() * 1000),
                r["backfill_requested_at"] is not None) for r in rows]


def sequenced() -> list[str]:
    """The gateways whose events carry a sequence backfilled from their event log (their fetch's ``backfill``)."""
    return [g.name for g in registry.GATEWAYS.values() if g.fetch is not None and g.fetch.backfill is not None]


async def observe_sequences(conn: Conn, decisions: Sequence[ProjectedDecision]) -> None:
    for gateway in sequenced():
        seen = [(d.sequence, d.received_at_ms) for d in decisions
                if d.gateway == gateway and d.sequence is not None and d.outcome != "quarantined"]
        if seen:
            await _observe(conn, gateway, seen)


async def _observe(conn: Conn, gateway: str, seen: list[tuple[int, int]]) -> None:
    """Fold a batch's sequence numbers into the gateway's gaps: only the gaps its late numbers fall
    in are read, and only those that changed are written (a broken sequence can leave a gap per
    event open). The open-gap gauges are read with the others (Projector.read_gauges)."""
    await conn.execute(sql.LOCK_SEQUENCES)
    max_seen = await conn.fetchval(sql.SELECT_SEQUENCE_MAX, gateway)
    late = sorted({seq for seq, _ in seen if seq <= max_seen}) if max_seen is not None else []
    rows = await conn.fetch(sql.SELECT_GAPS_HOLDING, gateway, late) if late else []
    folded = observe_all(max_seen, _gaps(rows), seen)
    if folded.max_seen != max_seen:
        await conn.execute(sql.UPSERT_SEQUENCE_MAX, gateway, folded.max_seen)
    if folded.removed:
        await conn.execute(sql.DELETE_GAPS, gateway, [g.start for g in folded.removed])
    if folded.added:
        requested = {r["start_seq"]: r["backfill_requested_at"] for r in rows}
        await write(conn, sql.GAPS, [(gateway, g.start, g.end, _ms_to_ts(g.first_seen_ms),
                                      requested.get(origin.start) if origin is not None else None)
                                     for g, origin in folded.added])


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
        self.exact: bool | None = None  # payloads stored as sent: the database is UTF-8 (_payload_json)
        self.backfilled_to: dict[str, int] = {}  # per gateway: the start of the last gap requested

    async def _set_aside(self, message: Any, reason: str) -> None:
        record = quarantine.set_aside_record(self.n, CONSUMER, message, reason)
        await self.producer.send_and_wait(*record)
        self.metrics.set_aside.labels(CONSUMER, dict(record[3]).get("gateway", b"").decode() or "unknown").inc()

    async def _apply(self, conn: Conn, messages: list[Any]) -> None:
        started = time.perf_counter()
        decisions = [PROJECTED.decode(m.value) for m in messages]
        if self.exact is None:  # once, on the first batch's connection: no round trip added to a start
            encoding = await conn.fetchval("SHOW server_encoding")
            self.exact = encoding == "UTF8"
            if not self.exact:
                log.warning("the database's encoding is %s, not UTF8: payloads are stored as read, not as sent "
                            "(docs/production.md, \"The database's encoding\")", encoding)
        await project(conn, decisions, self.metrics, self.exact)
        await observe_sequences(conn, decisions)
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
        records per stage, open sequence gaps, and both sinks' consumer lag. Every gateway and stage
        is set, 0 when it has none, so that an alert sees the value fall back, not the series vanish."""
        pool = self.sink.pool
        assert pool is not None
        m = self.metrics
        for sink in (self.sink, self.quarantine):  # first: read with PostgreSQL away too (PgSink.lag)
            m.consumer_lag.labels(sink.name, sink.topic).set(await sink.lag())
        parked = {r["gateway"]: r for r in await pool.fetch(PARKED_BY_GATEWAY,
                                                            float(self.settings.parked_alert_after_s))}
        for gateway in sorted(set(registry.GATEWAYS) | set(parked)):
            row = parked.get(gateway)
            m.parked_resources.labels(gateway).set(row["resources"] if row else 0)
            m.parked_events.labels(gateway).set(row["events"] if row else 0)
            m.parked_oldest_s.labels(gateway).set(row["oldest_s"] if row else 0.0)
            m.parked_overdue.labels(gateway).set(row["overdue"] if row else 0)
        quarantined = {r["stage"]: r["records"] for r in await pool.fetch(QUARANTINED_BY_STAGE)}
        for stage in sorted(set(STAGES) | set(quarantined)):
            m.quarantine_records.labels(stage).set(quarantined.get(stage, 0))
        if gateways := sequenced():
            gaps, missing = await pool.fetchrow(sql.GAPS_OPEN, gateways) or (0, 0)  # an aggregate: one row
            m.gaps_open.set(gaps)
            m.sequences_missing.set(missing)

    async def request_backfills(self) -> int:
        """Emit one fetch request per gap open longer than the limit (default 4 days), of each
        gateway whose sequence is backfilled: at most BACKFILLS_PER_PASS a pass, each pass going on
        from the gap after the last one requested (one whose fetch failed is unmarked by the fetcher
        and due again: it must not keep the gaps after it waiting), sent together and marked in one
        statement, so that the sequence lock is held for about a Kafka round trip."""
        pool = self.sink.pool
        assert pool is not None
        now_ms = int(time.time() * 1000)
        after_ms = int(self.settings.gap_backfill_after_s * 1000)
        cutoff = _ms_to_ts(now_ms - after_ms)
        requested = 0
        for gateway in sequenced():
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(sql.LOCK_SEQUENCES)
                last = self.backfilled_to.get(gateway, -1)
                rows = await conn.fetch(sql.SELECT_GAPS_DUE, gateway, cutoff, last, None, BACKFILLS_PER_PASS)
                if len(rows) < BACKFILLS_PER_PASS and last >= 0:  # then from the lowest again
                    rows += await conn.fetch(sql.SELECT_GAPS_DUE, gateway, cutoff, -1, last,
                                             BACKFILLS_PER_PASS - len(rows))
                due = due_for_backfill(_gaps(rows), now_ms, after_ms)
                await self.producer.send_all([(self.n.fetch, *backfill_request(gateway, gap.start, gap.end,
                                                                                gap.first_seen_ms)) for gap in due])
                await conn.execute(sql.MARK_BACKFILLS_REQUESTED, gateway, [gap.start for gap in due])
                self.backfilled_to[gateway] = due[-1].start if due else -1
                self.metrics.backfills.inc(len(due))
                requested += len(due)
        return requested


async def run(settings: Settings) -> None:
    projector, readiness = Projector(settings), Readiness()
    # Everything started is stopped in reverse order however the run ends, a SIGTERM during the
    # start included: a consumer that joined its group leaves it (app/process_setup.until_terminated).
    async with contextlib.AsyncExitStack() as started:
        await start_service(started, projector, projector.metrics.registry, settings.metrics_port,
                            settings.metrics_host, readiness)
        beside(started, every(GAUGES_EVERY_S, projector.read_gauges, "the projector's gauges"))
        last_check = 0.0
        while True:
            try:
                await projector.run_once()
                if time.monotonic() - last_check > min(30.0, settings.gap_backfill_after_s / 2):
                    last_check = time.monotonic()
                    await projector.request_backfills()
            except UNREACHABLE as exc:  # PostgreSQL away: wait, not ready, and take the batch again
                assert projector.sink.pool is not None
                await wait_for_postgres(projector.sink.pool, readiness, exc)


