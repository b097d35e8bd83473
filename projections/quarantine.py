"""The quarantine table: records any stage set aside, kept in PostgreSQL where an operator can read
them (I/O layer; DESIGN.md §2.4, §5). Redriving one is app/operator.py's.

``orderly.quarantine`` → the ``quarantine`` table (consumed by the projector process, offsets in
the same transaction). Redrive is an explicit operator action, never automatic: it appends the
stored body again to the topic it was set aside from (orderly.raw for the ingest's and the worker's,
the stage's own input for the projector's and the effects recorder's) under a new delivery id that
names the original, and marks the row.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
from aiokafka.structs import ConsumerRecord

from projections.bulk import Conn, printable, unnest_insert, write
from topics.catalog import TopicNames
from topics.records import (
    H_GATEWAY,
    H_REASON,
    H_RECEIVED_AT,
    H_RESOURCE,
    H_SOURCE_KEY,
    H_STAGE,
    H_TOPIC,
    quarantine_headers,
    received_ms_or_none,
)

UPSERT = unnest_insert("quarantine", """
    delivery_id text, gateway text, resource_id text, stage text, reason text, received_at timestamptz,
    topic text, record_key bytea, headers text::jsonb, body bytea""", """
ON CONFLICT (delivery_id) DO UPDATE
  SET stage = EXCLUDED.stage, reason = EXCLUDED.reason, topic = EXCLUDED.topic, record_key = EXCLUDED.record_key,
      headers = EXCLUDED.headers, body = EXCLUDED.body, quarantined_at = now()""", key="delivery_id")
LIST = """
SELECT delivery_id, gateway, resource_id, stage, reason, received_at, quarantined_at, redriven_at, redrives,
       length(body) AS bytes
  FROM quarantine WHERE ($1::text IS NULL OR stage = $1) AND ($2::text IS NULL OR gateway = $2)
 ORDER BY quarantined_at DESC, delivery_id LIMIT $3"""
SHOW = "SELECT * FROM quarantine WHERE delivery_id = $1"
MARK_REDRIVEN = "UPDATE quarantine SET redriven_at = now(), redrives = redrives + 1 WHERE delivery_id = $1"


def _text(value: bytes | None) -> str | None:
    return printable(value.decode(errors="replace")) if value is not None else None


def row(message: ConsumerRecord) -> tuple[Any, ...]:
    """A quarantine record as a table row; every text is made storable (no NUL)."""
    headers = dict(message.headers or [])
    resource = _text(headers.get(H_RESOURCE)) or ""
    gateway, _, resource_id = resource.partition(":")
    # None or 0: no time (appended some other way, or a decision of such a record)
    received = received_ms_or_none(headers.get(H_RECEIVED_AT))
    received_at = datetime.fromtimestamp(received / 1000, UTC) if received else None
    listed = [[k, printable((v or b"").decode(errors="replace"))] for k, v in message.headers or []]  # null: ""
    return (_text(message.key) or f"{message.topic}:{message.partition}:{message.offset}",
            _text(headers.get(H_GATEWAY)) or gateway or None, resource_id or None,
            _text(headers.get(H_STAGE)) or "unknown", _text(headers.get(H_REASON)) or "no reason given",
            received_at, _text(headers.get(H_TOPIC)), headers.get(H_SOURCE_KEY) or None,
            orjson.dumps(listed).decode(), message.value or b"")


async def record(conn: Conn, messages: list[ConsumerRecord]) -> None:
    rows: dict[str, tuple[Any, ...]] = {}
    for message in messages:  # the last of one id in a batch wins, as one statement cannot upsert a row twice
        r = row(message)
        rows[r[0]] = r
    await write(conn, UPSERT, list(rows.values()))


def set_aside_record(n: TopicNames, stage: str, message: ConsumerRecord, reason: str) -> tuple[str, bytes, bytes,
                                                                                               list[tuple[str, bytes]]]:
    """The orderly.quarantine record for a record of ``message.topic`` that ``stage`` set aside."""
    try:
        decoded = orjson.loads(message.value)
    except orjson.JSONDecodeError:
        decoded = None
    decoded = decoded if isinstance(decoded, dict) else {}
    resource = (f"{decoded['gateway']}:{decoded['resource_id']}"
                if isinstance(decoded.get("gateway"), str) and isinstance(decoded.get("resource_id"), str) else None)
    headers = [(H_TOPIC, message.topic.encode()), (H_SOURCE_KEY, message.key or b"")]
    if isinstance(decoded.get("gateway"), str):
        headers.append((H_GATEWAY, decoded["gateway"].encode()))
    if isinstance(decoded.get("received_at_ms"), int):  # 0, no time, is read as none (row)
        headers.append((H_RECEIVED_AT, str(decoded["received_at_ms"]).encode()))
    # A decision keeps its delivery's id, so the sweeper knows the delivery is handled; anything else
    # is named by where it was read.
    delivery = decoded.get("delivery_id")
    quarantine_id = (delivery if isinstance(delivery, str) and delivery
                     else f"{stage}:{message.topic}:{message.partition}:{message.offset}")
    return (n.quarantine, quarantine_id.encode(), message.value or b"",
            quarantine_headers(headers, stage, reason, resource))


async def listing(conn: Conn, stage: str | None = None, gateway: str | None = None,
                  limit: int = 50) -> list[dict[str, Any]]:
    return [dict(r) for r in await conn.fetch(LIST, stage, gateway, limit)]


async def one(conn: Conn, delivery_id: str, for_update: bool = False) -> dict[str, Any] | None:
    """One record; ``for_update`` locks its row to the end of the caller's transaction."""
    found = await conn.fetchrow(SHOW + " FOR UPDATE" if for_update else SHOW, delivery_id)
    if found is None:
        return None
    stored = dict(found)
    stored["headers"] = [tuple(pair) for pair in orjson.loads(stored["headers"])]  # jsonb arrives as text
    return stored
