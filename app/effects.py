"""`orderly effects`: records every effect once in PostgreSQL, then delivers it (I/O shell).

Recording: ``orderly.effects`` → ``effects`` rows (``ON CONFLICT (dedupe_key) DO NOTHING``) with the
consumed offsets in the same transaction, so an effect emitted twice upstream is one row.
Delivering: rows are claimed in a short transaction (a lease, ``FOR UPDATE SKIP LOCKED``), POSTed to
``ORDERLY_EFFECTS_URL`` with the dedupe key as ``Idempotency-Key`` with no transaction open, then
marked delivered, or rescheduled with backoff and marked dead after the last attempt.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson
from aiokafka.structs import ConsumerRecord

from app.metrics import EffectsMetrics, serve_metrics
from app.producer import KeyedProducer
from app.settings import Settings
from app.sink import PgSink
from projections import quarantine
from projections.bulk import Conn, printable, unnest_insert, write
from topics.catalog import names
from topics.records import EFFECTS as EFFECT_RECORDS

log = logging.getLogger("orderly.effects")
CLAIM_BATCH = 200

EFFECTS = unnest_insert("effects", "dedupe_key text, type text, gateway text, resource_id text, payload text::jsonb, "
                        "caused_by text", "ON CONFLICT (dedupe_key) DO NOTHING")
CLAIM_DUE = """
UPDATE effects SET next_attempt_at = now() + make_interval(secs => $2)
 WHERE dedupe_key IN (SELECT dedupe_key FROM effects
                       WHERE delivered_at IS NULL AND dead_at IS NULL AND next_attempt_at <= now()
                       ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING dedupe_key, type, gateway, resource_id, payload, caused_by, attempts"""
MARK_DELIVERED = """
UPDATE effects SET delivered_at = now(), attempts = attempts + 1, last_error = NULL WHERE dedupe_key = $1"""
MARK_FAILED = """
UPDATE effects SET attempts = attempts + 1, last_error = $2,
       next_attempt_at = now() + make_interval(secs => $3),
       dead_at = CASE WHEN attempts + 1 >= $4 THEN now() END
 WHERE dedupe_key = $1"""


def backoff_s(attempts: int) -> float:
    """Delay before the next attempt after ``attempts`` failures: 0.5 s doubling, capped at 5 min."""
    return float(min(0.5 * 2 ** max(attempts - 1, 0), 300.0))


async def record(conn: Conn, messages: list[ConsumerRecord]) -> None:
    effects = [EFFECT_RECORDS.decode(m.value) for m in messages]
    await write(conn, EFFECTS, [
        (e.dedupe_key, e.type, e.gateway, e.resource_id, orjson.dumps(e.payload).decode(), e.caused_by)
        for e in effects])


class EffectsWorker:
    def __init__(self, settings: Settings, deliver: bool = True) -> None:
        self.settings = settings
        self.deliver = deliver and settings.effects_url is not None
        self.metrics = EffectsMetrics()
        self.sink = PgSink(settings, "effects", names(settings.namespace).effects, self._record,
                           set_aside=self._set_aside)
        self.producer = KeyedProducer(settings.kafka_bootstrap)
        self.http: aiohttp.ClientSession | None = None

    async def _record(self, conn: Conn, messages: list[ConsumerRecord]) -> None:
        await record(conn, messages)
        self.metrics.recorded.inc(len(messages))

    async def _set_aside(self, message: ConsumerRecord, reason: str) -> None:
        record = quarantine.set_aside_record(names(self.settings.namespace), "effects", message, reason)
        await self.producer.send_and_wait(*record)
        self.metrics.set_aside.labels("effects", dict(record[3]).get("gateway", b"").decode() or "unknown").inc()

    async def start(self) -> None:
        await self.producer.start()
        await self.sink.start()
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def stop(self) -> None:
        await self.sink.stop()
        await self.producer.stop()
        if self.http is not None:
            await self.http.close()

    async def deliver_due(self) -> int:
        """Claim due effects and POST them; returns how many were attempted."""
        pool, http = self.sink.pool, self.http
        assert pool is not None and http is not None and self.settings.effects_url
        rows = await pool.fetch(CLAIM_DUE, CLAIM_BATCH, self.settings.effects_lease_s)  # its own short transaction
        if not rows:
            return 0
        url = self.settings.effects_url

        async def one(row: Any) -> None:
            error: str | None = None
            try:
                body = {"dedupe_key": row["dedupe_key"], "type": row["type"], "gateway": row["gateway"],
                        "resource_id": row["resource_id"], "payload": orjson.loads(row["payload"]),
                        "caused_by": row["caused_by"]}
                async with http.post(url, data=orjson.dumps(body), headers={
                        "Idempotency-Key": row["dedupe_key"], "Content-Type": "application/json"}) as resp:
                    if not 200 <= resp.status < 300:
                        error = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # a row no request can be made from: it backs off and ends dead, visibly
                error = f"{type(exc).__name__}: {exc}"
            if error is None:
                await pool.execute(MARK_DELIVERED, row["dedupe_key"])
                self.metrics.delivered.labels(row["type"]).inc()
            else:
                attempts = row["attempts"] + 1
                await pool.execute(MARK_FAILED, row["dedupe_key"], printable(error)[:500], backoff_s(attempts),
                                   self.settings.effects_max_attempts)
                self.metrics.failures.labels(row["type"]).inc()
                if attempts >= self.settings.effects_max_attempts:
                    self.metrics.dead.inc()
                    log.error("effect %s is dead after %d attempts: %s", row["dedupe_key"], attempts, error)

        await asyncio.gather(*(one(r) for r in rows))
        return len(rows)


async def run(settings: Settings) -> None:
    worker = EffectsWorker(settings)
    if not worker.deliver:
        log.warning("ORDERLY_EFFECTS_URL is not set: effects are recorded in PostgreSQL but not delivered")
    await worker.start()
    runner = await serve_metrics(worker.metrics.registry, settings.metrics_port) if settings.metrics_port else None
    try:
        while True:
            recorded = await worker.sink.run_once(timeout_ms=100)
            attempted = await worker.deliver_due() if worker.deliver else 0
            if not recorded and not attempted:
                await asyncio.sleep(0.05)
    finally:
        if runner is not None:
            await runner.cleanup()
        await worker.stop()
