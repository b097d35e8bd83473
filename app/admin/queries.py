"""What an operator reads: the queries behind the admin API, the console and the operator
commands (I/O layer over the PostgreSQL read models; DESIGN.md §3.1).

Every function returns plain JSON-ready values (datetimes stay datetimes until :func:`jsonable`),
so the API answers them as they are, the console renders them and the commands print them.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson

from app.admin import timeline
from app.gateways import registry
from projections.bulk import Conn

# The timeline: every delivery with its latest outcome and why, the gateway's own ordering fields
# read from the stored body (pg: version and global sequence; card: sequence and occurred_at;
# paymos: updated_at), and what the ingest set aside (it has no decision, only a quarantine row).
TIMELINE = """
SELECT delivery_id, event_id, event_type, received_at, outcome, error AS why, seq,
       coalesce(payload->>'created', payload->>'occurred_at', payload->'data'->>'updated_at',
                payload->>'created_at', payload->>'eventDate') AS gateway_time,
       payload->'data'->'object'->>'version' AS version, payload->>'sequence' AS sequence, payload
  FROM webhook_events
 WHERE gateway = $1 AND resource_id = $2
UNION ALL
SELECT q.delivery_id, NULL, NULL, q.received_at, 'quarantined', 'set aside by the ' || q.stage || ': ' || q.reason,
       NULL, NULL, NULL, NULL, NULL
  FROM quarantine q
 WHERE q.gateway = $1 AND q.resource_id = $2
   AND NOT EXISTS (SELECT 1 FROM webhook_events w WHERE w.delivery_id = q.delivery_id)
 ORDER BY received_at, seq NULLS LAST"""
RESOURCE_EFFECTS = """
SELECT dedupe_key, type, payload, caused_by, created_at, delivered_at, attempts, last_error, dead_at,
       next_attempt_at FROM effects
 WHERE gateway = $1 AND resource_id = $2 ORDER BY created_at, dedupe_key"""

# Effects pending, dead and delivered: the overview's counts (every effect) and the effects page's lists.
_EFFECT_STATE = {"pending": "delivered_at IS NULL AND dead_at IS NULL",
                 "dead": "dead_at IS NOT NULL AND delivered_at IS NULL",
                 "delivered": "delivered_at IS NOT NULL"}
_EFFECTS_BY_STATE = ",\n       ".join(f"(SELECT count(*) FROM effects WHERE {where}) AS effects_{state}"
                                     for state, where in _EFFECT_STATE.items())
# One pass over webhook_events for both columns of deliveries by outcome (app/admin/overview.py shares
# the result among readers: it reads the whole history); the rest are read through partial indexes,
# but for the quarantine's and the delivered effects' totals.
OVERVIEW = """
WITH t AS (  -- referenced twice: PostgreSQL reads it once
  SELECT outcome, count(*) AS n, count(*) FILTER (WHERE received_at > now() - interval '1 hour') AS recent
    FROM webhook_events GROUP BY outcome)
SELECT now() AS counted_at, (SELECT coalesce(jsonb_object_agg(outcome, n), '{}') FROM t) AS total,
       (SELECT coalesce(jsonb_object_agg(outcome, recent), '{}') FROM t WHERE recent > 0) AS last_hour,
       (SELECT count(DISTINCT (gateway, resource_id)) FROM webhook_events WHERE outcome = 'parked') AS parked,
       (SELECT count(*) FROM pg_sequence_gaps) AS open_gaps,
       (SELECT count(*) FROM quarantine WHERE redriven_at IS NULL) AS quarantined,
       (SELECT count(*) FROM quarantine) AS quarantined_total,
       """ + _EFFECTS_BY_STATE
# When an operator last changed what the counts count, by any admin or command (the audit; index
# admin_actions_changes): counts begun before it are stale.
LAST_CHANGE = """
SELECT max(at) FROM admin_actions
 WHERE action IN ('effects.retry', 'effects.retry.bulk', 'quarantine.redrive', 'quarantine.redrive.bulk',
                  'resources.fetch')"""
SINK_POSITIONS = "SELECT consumer, topic, partition, next_offset FROM projector_offsets"

PARKED = """
SELECT gateway, resource_id, count(*) AS deliveries, min(received_at) AS parked_since,
       (array_agg(coalesce(error, '') ORDER BY received_at))[1] AS why,
       (array_agg(event_type ORDER BY received_at))[1] AS first_event_type,
       min(received_at) < now() - make_interval(secs => $2) AS overdue
  FROM webhook_events WHERE outcome = 'parked'
 GROUP BY gateway, resource_id ORDER BY min(received_at) LIMIT $1"""
GAPS = """
SELECT merchant, start_seq, end_seq, end_seq - start_seq + 1 AS missing, first_seen_at,
       extract(epoch FROM now() - first_seen_at)::bigint AS age_s, backfill_requested_at
  FROM pg_sequence_gaps ORDER BY first_seen_at, start_seq LIMIT $1"""

# The effects page's and GET /api/effects' lists, newest first, one statement a state: the delivered ones,
# which only accumulate, read in order through 0018's effects_delivered; the others through their partial
# indexes (effects_due, effects_dead), sorted (a million pending: 0.3 s).
_EFFECTS = """
SELECT dedupe_key, type, gateway, resource_id, caused_by, created_at, delivered_at, dead_at, attempts, last_error,
       next_attempt_at
  FROM effects WHERE {where}
 ORDER BY created_at DESC, dedupe_key LIMIT $1"""
EFFECTS = {state: _EFFECTS.format(where=where) for state, where in _EFFECT_STATE.items()}
EFFECT_STATES = ("pending", "dead", "delivered")
# The effects page's tabs, read with its list on each visit: each counted up to EFFECT_COUNT_CAP, so the
# count costs the same whatever the history holds (shown as "100,000+" past it; the overview's shared
# counts count every effect).
EFFECT_COUNT_CAP = 100_000
EFFECT_COUNTS = "SELECT " + ",\n       ".join(
    f"(SELECT count(*) FROM (SELECT FROM effects WHERE {where} LIMIT $1) e) AS effects_{state}"
    for state, where in _EFFECT_STATE.items())

AUDIT = """
SELECT id, at, actor, action, target, result FROM admin_actions
 WHERE ($2::text IS NULL OR actor = $2 OR split_part(actor, '@', 1) = $2) AND ($3::text IS NULL OR action = $3)
 ORDER BY id DESC LIMIT $1
"""
AUDIT_WRITE = "INSERT INTO admin_actions (actor, action, target, result) VALUES ($1, $2, $3, $4) RETURNING id"
JSON_COLUMNS = {"payload", "fee_breakdown", "overpayment", "snapshot"}


def _plain(record: Any) -> dict[str, Any]:
    return {k: orjson.loads(v) if k in JSON_COLUMNS and isinstance(v, str) else v for k, v in record.items()}


def status_union() -> str:
    """(gateway, resource_id, kind, status) of every resource, from each gateway's state tables."""
    parts = []
    for gateway in registry.GATEWAYS.values():
        for table in gateway.tables:
            if not table.key:
                continue
            columns = {c.strip() for c in table.compared.split(",")}
            status = "status" if "status" in columns else "state" if "state" in columns else "NULL"
            parts.append(f"SELECT '{gateway.name}'::text AS gateway, {table.key}::text AS resource_id, "
                         f"'{table.kind or table.name}'::text AS kind, {status}::text AS status FROM {table.name}")
    return " UNION ALL ".join(parts) or "SELECT NULL::text, NULL::text, NULL::text, NULL::text WHERE false"


async def resource(conn: Conn, gateway: str, resource_id: str,
                   order: timeline.Order = "arrival") -> dict[str, Any] | None:
    """Current state, the decision timeline with each delivery's effects (in arrival or gateway
    order, each with both positions and whether it arrived late: app/admin/timeline.py), or None if
    unknown."""
    state = None
    found = registry.find(gateway)
    for kind, query in found.state_queries() if found is not None else []:
        row = await conn.fetchrow(query, resource_id)
        if row is not None:
            state = {"kind": kind, **_plain(row)}
            break
    deliveries = [_plain(r) for r in await conn.fetch(TIMELINE, gateway, resource_id)]
    effects = [{**_plain(r), "status": effect_status(r)} for r in await conn.fetch(RESOURCE_EFFECTS, gateway,
                                                                                      resource_id)]
    if state is None and not deliveries:
        return None
    by_delivery: dict[str, list[dict[str, Any]]] = {}
    for effect in effects:
        by_delivery.setdefault(effect["caused_by"], []).append(effect)
    for delivery in deliveries:
        if delivery["outcome"] == "parked" and not delivery["why"]:
            delivery["why"] = parked_because(gateway) or None
        delivery["effects"] = by_delivery.get(delivery["delivery_id"], [])
    listed = timeline.ordered(deliveries, order)
    return {"gateway": gateway, "resource_id": resource_id, "state": state,
            "parked": sum(1 for d in deliveries if d["outcome"] == "parked"), "order": order,
            "late": sum(1 for d in listed if d["late"]), "timeline": listed, "effects": effects}


def effect_status(row: Any) -> str:
    return "delivered" if row["delivered_at"] else "dead" if row["dead_at"] else "pending"


async def overview(conn: Conn, within_s: float | None = None) -> dict[str, Any]:
    """The overview's counts (``within_s``: seconds the query may take, past the connection's own)."""
    row = await conn.fetchrow(OVERVIEW, timeout=within_s)
    assert row is not None
    counts = dict(row)
    return {"deliveries": {"total": orjson.loads(counts.pop("total")),
                           "last_hour": orjson.loads(counts.pop("last_hour"))}, **counts}


async def sink_positions(conn: Conn) -> list[tuple[str, str, int, int]]:
    """(consumer, topic, partition, next offset) the projector and effects recorder stored."""
    return [(r["consumer"], r["topic"], r["partition"], r["next_offset"]) for r in await conn.fetch(SINK_POSITIONS)]



def parked_because(gateway: str) -> str:
    """What a parked delivery of ``gateway`` waits for when its decision gives no reason (its registry line)."""
    found = registry.find(gateway)
    return found.parked_because if found is not None else ""


async def parked(conn: Conn, limit: int = 200, overdue_after_s: float = 3600.0) -> list[dict[str, Any]]:
    """Resources holding parked deliveries, oldest first; ``overdue`` once the oldest has waited
    longer than ``overdue_after_s`` (ORDERLY_PARKED_ALERT_AFTER_S): for a gateway without a fetch
    (adyen) nothing but the operator can help it then (DESIGN §2.6)."""
    out = []
    for r in await conn.fetch(PARKED, limit, float(overdue_after_s)):
        row = dict(r)
        row["why"] = row["why"] or parked_because(row["gateway"])
        out.append(row)
    return out


async def gaps(conn: Conn, limit: int = 200) -> list[dict[str, Any]]:
    rows = []
    for r in await conn.fetch(GAPS, limit):
        row = dict(r)
        row["backfill"] = "requested" if row["backfill_requested_at"] else "waiting (requested after 4 days)"
        rows.append(row)
    return rows


async def effects(conn: Conn, state: str, limit: int = 100) -> list[dict[str, Any]]:
    if state not in EFFECT_STATES:
        raise ValueError(f"state must be one of {', '.join(EFFECT_STATES)}")
    return [{**dict(r), "status": state} for r in await conn.fetch(EFFECTS[state], limit)]


async def effect_counts(conn: Conn) -> dict[str, int]:
    """The effects page's tabs: each state's count, EFFECT_COUNT_CAP + 1 for any count past the cap."""
    counted = await conn.fetchrow(EFFECT_COUNTS, EFFECT_COUNT_CAP + 1)
    assert counted is not None  # a SELECT of subqueries: always one row
    return dict(counted.items())


async def audit_log(conn: Conn, limit: int = 50, actor: str | None = None,
                    action: str | None = None) -> list[dict[str, Any]]:
    """Newest first; ``actor`` matches ``person@address`` whole or the person alone."""
    return [dict(r) for r in await conn.fetch(AUDIT, limit, actor, action)]


async def audit(conn: Conn, actor: str, action: str, target: str, result: str) -> int:
    """Write one admin_actions row; returns its id."""
    value = await conn.fetchval(AUDIT_WRITE, actor[:200], action, target[:500], result[:1000])
    return int(value)


def jsonable(value: Any) -> Any:
    """For orjson's ``default``: NUMERIC (crypto amounts) as a decimal string, never a float; bytes
    as text."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return repr(value)


def dumps(body: Any) -> bytes:
    return orjson.dumps(body, default=jsonable)
