"""`GET /resources/{gateway}/{id}`: a resource's current state and its decision timeline (I/O shell).

Read from the PostgreSQL read models the projector keeps: the state row(s), then every delivery
with its outcome and the effects its applied transition emitted.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import asyncpg
import orjson

from app.gateways import registry

# What the ingest set aside has no decision, only its quarantine row: it shows as quarantined too.
TIMELINE = """
SELECT delivery_id, event_id, event_type, received_at, outcome, error, payload, seq FROM webhook_events
 WHERE gateway = $1 AND resource_id = $2
UNION ALL
SELECT q.delivery_id, NULL, NULL, q.received_at, 'quarantined', 'set aside by the ' || q.stage || ': ' || q.reason,
       NULL, NULL
  FROM quarantine q
 WHERE q.gateway = $1 AND q.resource_id = $2
   AND NOT EXISTS (SELECT 1 FROM webhook_events w WHERE w.delivery_id = q.delivery_id)
 ORDER BY received_at, seq NULLS LAST"""
EFFECTS = """
SELECT dedupe_key, type, payload, caused_by, created_at, delivered_at, attempts, last_error, dead_at FROM effects
 WHERE gateway = $1 AND resource_id = $2 ORDER BY created_at"""
JSON_COLUMNS = {"payload", "fee_breakdown", "overpayment", "snapshot"}


def _plain(record: asyncpg.Record) -> dict[str, Any]:
    return {k: orjson.loads(v) if k in JSON_COLUMNS and isinstance(v, str) else v for k, v in record.items()}


async def resource(pool: asyncpg.Pool, gateway: str, resource_id: str) -> dict[str, Any] | None:
    async with pool.acquire() as conn:
        state = None
        found = registry.find(gateway)
        for kind, query in found.state_queries() if found is not None else []:
            row = await conn.fetchrow(query, resource_id)
            if row is not None:
                state = {"kind": kind, **_plain(row)}
                break
        deliveries = [_plain(r) for r in await conn.fetch(TIMELINE, gateway, resource_id)]
        effects = [_plain(r) for r in await conn.fetch(EFFECTS, gateway, resource_id)]
    if state is None and not deliveries:
        return None
    by_delivery: dict[str, list[dict[str, Any]]] = {}
    for effect in effects:
        by_delivery.setdefault(effect["caused_by"], []).append(effect)
    for delivery in deliveries:
        delivery["effects"] = by_delivery.get(delivery["delivery_id"], [])
    return {"gateway": gateway, "resource_id": resource_id, "state": state,
            "parked": sum(1 for d in deliveries if d["outcome"] == "parked"), "timeline": deliveries}


def dumps(body: dict[str, Any]) -> bytes:
    # NUMERIC (crypto amounts) leaves as a decimal string, never a float
    return orjson.dumps(body, default=lambda v: str(v) if isinstance(v, Decimal) else repr(v))
