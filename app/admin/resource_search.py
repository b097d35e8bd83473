"""Finding resources: the console's and the API's search, newest delivery first, page after page
(I/O layer over the PostgreSQL read models; DESIGN.md §3.1).

Three ways, each for what the reader gave:

- **A whole id** (a resource id, a gateway event id or a delivery id: what an on-call engineer has
  from a log line, the ingest's answer, an effect's ``caused_by`` or the gateway's dashboard) is
  found through the indexes on ``webhook_events``, at any size of the history (under 2 ms at three
  million deliveries, where grouping them all took 0.4 s). It lists that id's resources only (a
  status filters them), not those whose ids hold it.
- **Part of a resource id**, when no whole id matches or when asked (``match`` "part"), or a status
  alone: every delivery is read and grouped (0.4 s at three million), within the request's deadline.
- **Nothing**: newest first, read back in time a slice at a time (:func:`_recent`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from app.admin.queries import status_union
from app.gateways import registry
from app.gateways.limits import DELIVERY_ID_MAX
from app.pg_pool import prepared_anew
from projections.bulk import Conn

# The longest id a search may hold: any delivery id the admin takes (app/gateways/limits.py).
Q_MAX = DELIVERY_ID_MAX

# The resources of which ``$2`` is the whole resource id, an event id or a delivery id, of one of the
# gateways ``$1``: one probe of an index each (webhook_events' (gateway, resource_id, received_at),
# (gateway, event_id), its key), written apart so that any plan, a generic one too, can only probe.
_WHOLE = """
SELECT gateway, resource_id FROM webhook_events WHERE gateway = ANY($1::text[]) AND resource_id = $2
UNION
SELECT gateway, resource_id FROM webhook_events
 WHERE gateway = ANY($1::text[]) AND event_id = $2 AND resource_id IS NOT NULL
UNION
SELECT gateway, resource_id FROM webhook_events
 WHERE delivery_id = $2 AND gateway = ANY($1::text[]) AND resource_id IS NOT NULL"""
WHOLE_ID = f"SELECT EXISTS ({_WHOLE.replace('UNION', 'UNION ALL')})"  # any row: none deduplicated
# Their rows, each resource counted through its own index entries, its status from its state table
# (built from the registry: queries.status_union), newest first; the cursor is the last row's (time,
# gateway, id).
BY_WHOLE_ID = """
WITH k AS (""" + _WHOLE + """)
SELECT k.gateway, k.resource_id, d.last_at, d.deliveries, d.parked, s.kind, s.status
  FROM k CROSS JOIN LATERAL (
         SELECT max(received_at) AS last_at, count(*) AS deliveries,
                count(*) FILTER (WHERE w.outcome = 'parked') AS parked
           FROM webhook_events w WHERE w.gateway = k.gateway AND w.resource_id = k.resource_id) d
  LEFT JOIN ({statuses}) s ON s.gateway = k.gateway AND s.resource_id = k.resource_id
 WHERE ($3::text IS NULL OR s.status = $3 OR ($3 = 'parked' AND d.parked > 0))
   AND ($4::timestamptz IS NULL OR (d.last_at, k.gateway, k.resource_id) < ($4, $5, $6))
 ORDER BY d.last_at DESC, k.gateway DESC, k.resource_id DESC
 LIMIT $7"""
# Part of a resource id, or a status alone: every delivery grouped by resource.
SEARCH = """
WITH r AS (
  SELECT gateway, resource_id, max(received_at) AS last_at, count(*) AS deliveries,
         count(*) FILTER (WHERE outcome = 'parked') AS parked
    FROM webhook_events
   WHERE resource_id IS NOT NULL AND ($1::text IS NULL OR gateway = $1)
     AND ($3::text IS NULL OR resource_id ILIKE '%' || $3 || '%' ESCAPE '\\')
   GROUP BY gateway, resource_id)
SELECT r.gateway, r.resource_id, r.last_at, r.deliveries, r.parked, s.kind, s.status
  FROM r LEFT JOIN ({statuses}) s ON s.gateway = r.gateway AND s.resource_id = r.resource_id
 WHERE ($2::text IS NULL OR s.status = $2 OR ($2 = 'parked' AND r.parked > 0))
   AND ($4::timestamptz IS NULL OR (r.last_at, r.gateway, r.resource_id) < ($4, $5, $6))
 ORDER BY r.last_at DESC, r.gateway DESC, r.resource_id DESC
 LIMIT $7"""

# A delivery the ingest or the worker set aside (of the gateway searched): how often it was redriven.
SET_ASIDE = "SELECT redrives FROM quarantine WHERE delivery_id = $1 AND ($2::text IS NULL OR gateway = $2)"

# Without a text search or a status, newest first reads back in time a slice at a time (10 s, then 8
# times as long each: 80 s, 11 min, 1.4 h, 11 h, 3.8 d, 30 d, 8 months, 5.3 years, all before)
# through the BRIN index on received_at, until a page is full. A slice's resources are those whose
# last delivery falls in it (none since: NOT EXISTS), ranked and cut in PostgreSQL, so its order and
# the cursor's comparison are the database's (its collation); every one ranks below the newer
# slices' resources. Only the page's resources are counted and given their status.
SLICES = (10.0, 8.0, 9)  # the first slice's seconds, how much longer each next one is, how many before "all"
LISTING_DEADLINE_S = 10.0  # all the slices together (app/admin/context.py POSTGRES_DEADLINE_S)
RECENT = """
WITH c AS (
  SELECT gateway, resource_id, max(received_at) AS last_at FROM webhook_events
   WHERE resource_id IS NOT NULL AND ($1::text IS NULL OR gateway = $1){bounds}
   GROUP BY gateway, resource_id),
f AS (
  SELECT c.gateway, c.resource_id, c.last_at FROM c
   WHERE {since_none}($2::timestamptz IS NULL OR (c.last_at, c.gateway, c.resource_id) < ($2, $3, $4))
   ORDER BY c.last_at DESC, c.gateway DESC, c.resource_id DESC LIMIT $5)
SELECT f.gateway, f.resource_id, f.last_at, d.deliveries, d.parked, s.kind, s.status
  FROM f CROSS JOIN LATERAL (
         SELECT count(*) AS deliveries, count(*) FILTER (WHERE w.outcome = 'parked') AS parked
           FROM webhook_events w WHERE w.gateway = f.gateway AND w.resource_id = f.resource_id) d
  LEFT JOIN ({statuses}) s ON s.gateway = f.gateway AND s.resource_id = f.resource_id
 ORDER BY f.last_at DESC, f.gateway DESC, f.resource_id DESC"""


def recent_statement(since: bool, until: str | None, statuses: str | None = None) -> str:
    """RECENT for the bounds present (``until``: "<", or "<=" for the cursor's own time), each written as a
    plain comparison: a prepared statement's generic plan cannot narrow a scan by "$6 IS NULL OR ..."."""
    bounds, since_none, n = "", "", 6
    if since:
        bounds += f" AND received_at >= ${n}"
        n += 1
    if until is not None:
        bounds += f" AND received_at {until} ${n}"
        later = ">=" if until == "<" else ">"
        since_none = (f"NOT EXISTS (SELECT 1 FROM webhook_events n WHERE n.gateway = c.gateway "
                      f"AND n.resource_id = c.resource_id AND n.received_at {later} ${n}) AND ")
    return RECENT.format(bounds=bounds, since_none=since_none, statuses=statuses or status_union())


class BadCursor(ValueError):
    """A search cursor that this API did not hand out."""


MATCHES = ("auto", "part")  # a whole id if q is one, else part of a resource id; part of a resource id only


@dataclass(frozen=True)
class Cursor:
    last_at: datetime
    gateway: str
    resource_id: str
    match: str | None = None  # how the first page matched q ("whole" or "part"): the next pages match so too

    def encode(self) -> str:
        raw = orjson.dumps([self.last_at.isoformat(), self.gateway, self.resource_id,
                            *([self.match] if self.match else [])])
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        try:
            at, gateway, resource_id, *match = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            last_at = datetime.fromisoformat(at).astimezone(UTC)  # out of range: OverflowError
            if not (isinstance(gateway, str) and isinstance(resource_id, str)) or "\x00" in gateway + resource_id \
                    or match not in ([], ["whole"], ["part"]):
                raise ValueError("not a cursor")
            return cls(last_at, gateway, resource_id, *match)
        except (ValueError, TypeError, OverflowError, binascii.Error, orjson.JSONDecodeError):
            raise BadCursor("cursor is not one this API handed out") from None


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def search(conn: Conn, gateway: str | None = None, status: str | None = None, q: str | None = None,
                 limit: int = 50, cursor: str | None = None, match: str = "auto") -> dict[str, Any]:
    """Resources, newest delivery first; ``next_cursor`` continues after the last one (None: no more).
    ``q`` (``match`` "auto") is a whole resource id, event id or delivery id, else part of a resource
    id; with ``match`` "part", part of a resource id. ``match`` in the answer says which it was, and
    the next pages keep to it."""
    after = Cursor.decode(cursor) if cursor else None
    at = (after.last_at, after.gateway, after.resource_id) if after else (None, None, None)
    gateway, status = gateway or None, status or None
    gateways = [gateway] if gateway else list(registry.GATEWAYS)
    matched = None
    if q:
        matched = after.match if after and after.match else "part" if match == "part" else \
            "whole" if await conn.fetchval(WHOLE_ID, gateways, q) else "part"
    if matched == "whole":
        rows = await conn.fetch(BY_WHOLE_ID.format(statuses=status_union()), gateways, q, status, *at, limit + 1)
    elif q or status:
        rows = await conn.fetch(SEARCH.format(statuses=status_union()), gateway, status, _like(q) if q else None,
                                *at, limit + 1)
    else:
        rows = await _recent_in_snapshot(conn, gateway, limit + 1, after)
    items = [dict(r) for r in rows[:limit]]
    last = items[-1] if items and len(rows) > limit else None
    return {"items": items, "match": matched, "next_cursor": Cursor(
        last["last_at"], last["gateway"], last["resource_id"], matched).encode() if last else None}


async def set_aside(conn: Conn, q: str, gateway: str | None) -> int | None:
    """How often the delivery ``q`` (of ``gateway``) set aside was redriven; None: it was not set aside."""
    redrives: int | None = await conn.fetchval(SET_ASIDE, q, gateway)
    return redrives


async def _recent_in_snapshot(conn: Conn, gateway: str | None, wanted: int, after: Cursor | None) -> list[Any]:
    """:func:`_recent` in one snapshot (a delivery stored between two slices would hide its resource
    from both), with one deadline for every slice, as for a single statement. A statement a migration
    made stale (a column's type changed under it) fails inside a transaction, where asyncpg does not
    prepare it again as it does outside one: the read is made once more, prepared anew, within what
    is left of the same deadline."""
    deadline = asyncio.get_running_loop().time() + LISTING_DEADLINE_S

    async def read() -> list[Any]:
        async with conn.transaction(isolation="repeatable_read", readonly=True), asyncio.timeout_at(deadline):
            return await _recent(conn, gateway, wanted, after)

    return await prepared_anew(read)


async def _recent(conn: Conn, gateway: str | None, wanted: int, after: Cursor | None) -> list[Any]:
    """The first ``wanted`` resources newest first (after the cursor), read back a slice at a time."""
    found: list[Any] = []
    statuses = status_union()  # once for every slice
    first, longer, slices = SLICES
    until, until_op = (after.last_at, "<=") if after else (None, None)
    since = _earlier(after.last_at if after else datetime.now(UTC), first)
    span = first
    cursor = (after.last_at, after.gateway, after.resource_id) if after else (None, None, None)
    for n in range(slices + 1):
        if n == slices:
            since = None  # the rest of the history, at once
        statement = recent_statement(since is not None, until_op, statuses)
        bounds = [b for b in (since, until) if b is not None]
        found += await conn.fetch(statement, gateway, *cursor, wanted - len(found), *bounds)
        if len(found) >= wanted or since is None:
            break
        span *= longer
        until, until_op, since = since, "<", _earlier(since, span)
    return found


def _earlier(moment: datetime, seconds: float) -> datetime | None:
    """``seconds`` before ``moment``; None (all before) past the calendar's start."""
    try:
        return moment - timedelta(seconds=seconds)
    except OverflowError:
        return None
