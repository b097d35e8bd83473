"""What an operator does: redrive a quarantined record, retry a dead effect, ask a gateway for a
resource now (I/O layer; DESIGN.md §3.1). The admin API, the console and the operator commands
call these same functions, and each call is written to the ``admin_actions`` audit table.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass

import orjson

from app.admin.queries import audit
from app.core.gaps import backfill_request
from app.gateways import registry
from app.gateways.limits import id_error
from app.producer import KeyedProducer
from app.waits import within
from projections import quarantine, sql
from projections.bulk import Conn
from topics.catalog import TopicNames
from topics.records import (
    H_DELIVERY_ID,
    H_REASON,
    H_RECEIVED_AT,
    H_RESOURCE,
    H_SOURCE_KEY,
    H_STAGE,
    H_TOPIC,
)


class ActionRefused(ValueError):
    """The action cannot be taken; the message says why. ``status`` is the HTTP answer."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Done:
    action: str
    target: str
    result: str  # one line, for the audit row and the operator


async def audited(conn: Conn, actor: str, action: str, target: str, result: str) -> Done:
    await audit(conn, actor, action, target, result)
    return Done(action, target, result)


async def carried_out(conn: Conn, actor: str, action: str, target: str, doing: Awaitable[str]) -> Done:
    """Run an action and audit what came of it: its result, or why it was refused."""
    try:
        result = await doing
    except ActionRefused as exc:
        await audit(conn, actor, action, target, f"refused: {exc}")
        raise
    return await audited(conn, actor, action, target, result)


APPEND_DEADLINE_S = 10.0


async def append(producer: KeyedProducer, topic: str, key: bytes, value: bytes,
                 headers: list[tuple[str, bytes]]) -> None:
    """One append, acknowledged within the deadline: with the broker away the operator gets an
    answer, not a request that hangs until it is back."""
    await acknowledged(producer.send_and_wait(topic, key, value, headers))


async def acknowledged(sending: Awaitable[object]) -> None:
    """``sending`` acknowledged by Kafka within the deadline, or the action refused (503)."""
    try:
        await within(sending, APPEND_DEADLINE_S)
    except Exception as exc:  # timeout or KafkaError: either way not acknowledged
        raise ActionRefused(f"Kafka did not acknowledge the append within {APPEND_DEADLINE_S:.0f} s "
                            f"({type(exc).__name__}); it may still be appended when the broker is back, so "
                            "look at the timeline before you repeat it", 503) from exc


async def redrive(conn: Conn, producer: KeyedProducer, n: TopicNames, delivery_id: str, now_ms: int,
                  actor: str) -> Done:
    """Append a quarantined record's body again where it was set aside from, and mark it. The
    original stays in the table (with its redrive count); the new delivery's id names it."""
    return await carried_out(conn, actor, "quarantine.redrive", delivery_id,
                             redrive_one(conn, producer, n, delivery_id, now_ms))


async def redrive_one(conn: Conn, producer: KeyedProducer, n: TopicNames, delivery_id: str, now_ms: int,
                      picked_at_redrives: int | None = None) -> str:
    """The redrive itself, unaudited: :func:`redrive` audits one, app/admin/bulk.py a filter's worth
    (``picked_at_redrives``: the redrives the row had when the filter picked it; another call
    that redrove it since leaves it alone, so two bulk calls at once append each record once)."""
    # the row stays locked until the append is acknowledged and counted: two redrives at once
    # get ~rN and ~rN+1, never the same delivery id twice
    async with conn.transaction():
        stored = await quarantine.one(conn, delivery_id, for_update=True)
        if stored is None:
            raise ActionRefused(f"no quarantined record {delivery_id!r}", 404)
        if picked_at_redrives is not None and stored["redrives"] != picked_at_redrives:
            raise ActionRefused(f"{delivery_id}: redriven meanwhile by another call; left as it is", 409)
        body: bytes = stored["body"]
        original = {k: v for k, v in stored["headers"]}
        new_id = f"{delivery_id}~r{stored['redrives'] + 1}"
        topic = stored["topic"] or n.raw
        if stored["stage"] in ("ingest", "worker") or topic == n.raw:
            gateway = stored["gateway"]
            found = registry.find(gateway or "")
            if original.get("record") == "correlation":
                key = stored["record_key"] or f"{gateway}:{stored['resource_id']}".encode()
            elif found is None:
                raise ActionRefused(f"{delivery_id}: no gateway recorded, so nowhere to route it")
            else:
                route = found.adapter.route(body)
                if route.resource_key is None:
                    raise ActionRefused(f"{delivery_id}: still refused by the {gateway} adapter: "
                                        f"{route.quarantine_reason}")
                key = route.resource_key.encode()
            headers = [(k, v.encode()) for k, v in original.items()
                       if k not in (H_STAGE, H_REASON, H_RESOURCE, H_TOPIC, H_SOURCE_KEY, H_DELIVERY_ID)]
            headers += [(H_DELIVERY_ID, new_id.encode())]
            if H_RECEIVED_AT not in original:
                headers.append((H_RECEIVED_AT, str(now_ms).encode()))
            target = n.raw
        else:
            key = stored["record_key"] or b""
            headers, target = [], topic
        await append(producer, target, key, body, headers)
        await conn.execute(quarantine.MARK_REDRIVEN, delivery_id)
        return f"appended to {target} as delivery {new_id}" if target == n.raw else f"appended to {target} again"


RETRY = """
UPDATE effects SET dead_at = NULL, next_attempt_at = now()
 WHERE dedupe_key = $1 AND dead_at IS NOT NULL AND delivered_at IS NULL RETURNING attempts"""
EFFECT_STATE = "SELECT delivered_at, dead_at FROM effects WHERE dedupe_key = $1"


async def retry_effect(conn: Conn, dedupe_key: str, actor: str) -> Done:
    """A dead effect back to pending: the effects worker attempts it at once (one more attempt;
    failing again makes it dead again)."""
    attempts = await conn.fetchval(RETRY, dedupe_key)
    if attempts is None:
        row = await conn.fetchrow(EFFECT_STATE, dedupe_key)
        reason = ("no effect with this key" if row is None else
                  "already delivered" if row["delivered_at"] else "not dead: it is pending and will be attempted")
        await audit(conn, actor, "effects.retry", dedupe_key, f"refused: {reason}")
        raise ActionRefused(f"{dedupe_key}: {reason}", 404 if row is None else 409)
    return await audited(conn, actor, "effects.retry", dedupe_key, f"pending again after {attempts} attempt(s)")


OPEN_GAPS = "SELECT start_seq, end_seq FROM pg_sequence_gaps WHERE merchant = $1 ORDER BY start_seq"


async def request_fetch(conn: Conn, producer: KeyedProducer, n: TopicNames, gateway: str, resource_id: str,
                        actor: str, api_url: str | None) -> Done:
    """Ask the fetcher to get the resource from its gateway now, as the gateway's registry line says
    (its ``fetch``): a resource by its id (card: ``GET /payments/{ref}``), or, for a gateway whose
    event log is read by sequence (pg), the backfill of every open sequence gap."""
    if error := id_error("resource_id", resource_id):
        raise ActionRefused(error, 400)  # nothing to audit: no resource was named
    return await carried_out(conn, actor, "resources.fetch", f"{gateway}:{resource_id}",
                             _request_fetch(conn, producer, n, gateway, resource_id, api_url))


async def _request_fetch(conn: Conn, producer: KeyedProducer, n: TopicNames, gateway: str, resource_id: str,
                         api_url: str | None) -> str:
    found = registry.find(gateway)
    fetch = found.fetch if found is not None else None
    if fetch is None:
        raise ActionRefused(f"the {gateway} gateway has no API to fetch a resource from", 422)
    if api_url is None:  # the fetcher would leave the request unread
        raise ActionRefused(f"ORDERLY_{gateway.upper()}_API_URL is not set, so the fetcher cannot ask the "
                            f"{gateway} gateway: nothing was done")
    if fetch.resource is not None:
        request = {"gateway": gateway, "kind": fetch.kind, fetch.id_field: resource_id}
        await append(producer, n.fetch, f"{gateway}:{resource_id}".encode(), orjson.dumps(request), [])
        return f"fetch of the {gateway} {fetch.kind} requested"
    # under the sequence lock, as the projector's backfill pass: a fetch that fails unmarks its gap
    # only after this marks it, and no gap is cut between the read and the mark
    async with conn.transaction():
        await conn.execute(sql.LOCK_SEQUENCES)
        gaps = await conn.fetch(OPEN_GAPS, gateway)
        if not gaps:
            raise ActionRefused(f"{gateway} events are fetched by sequence: there is no open gap to backfill")
        await acknowledged(producer.send_all([(n.fetch, *backfill_request(gateway, gap["start_seq"], gap["end_seq"]))
                                              for gap in gaps]))
        await conn.execute(sql.MARK_BACKFILLS_REQUESTED, gateway, [gap["start_seq"] for gap in gaps])
    return f"backfill of {len(gaps)} open gap(s) requested"


async def audit_login(conn: Conn, actor: str, ok: bool) -> None:
    await audit(conn, actor, "console.login", "console", "signed in" if ok else "refused: wrong token")
