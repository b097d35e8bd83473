"""`orderly reconcile`: every card payment whose row disagrees with its own stored events.

The playbook's nightly check: totals are a function of the rows, so re-running the reducer over a
payment's stored events must give the row's state and totals. Expected: no payment listed.
"""

from __future__ import annotations

import sys
from typing import Any

import asyncpg

from app.core.card import reduce, stored_event
from app.settings import Settings
from projections.migrate import quote_ident


async def mismatches(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    events: dict[str, list[Any]] = {}
    for r in await conn.fetch("SELECT payment_ref, payload FROM card_events"):
        events.setdefault(r["payment_ref"], []).append(stored_event(bytes(r["payload"])))
    found = []
    for row in await conn.fetch("SELECT * FROM card_payments ORDER BY payment_ref"):
        derived = reduce(events.get(row["payment_ref"], []))
        want = (derived.state, derived.authorised_minor, derived.captured_minor, derived.refunded_minor)
        have = (row["state"], row["authorised_minor"], row["captured_minor"], row["refunded_minor"])
        if want != have:
            found.append({"payment_ref": row["payment_ref"], "row": have, "from_events": want})
    return found


async def run(settings: Settings, out: Any = sys.stdout) -> int:
    conn = await asyncpg.connect(settings.postgres_dsn.reveal(),
                                 server_settings={"search_path": quote_ident(settings.namespace)})
    try:
        found = await mismatches(conn)
    finally:
        await conn.close()
    for m in found:
        print(f"{m['payment_ref']}: row {m['row']} != events {m['from_events']}", file=out)
    print(f"{len(found)} card payment(s) differ from their events", file=out)
    return 1 if found else 0
