"""`orderly simulate --check --target URL`: the same seeded histories through a running stack (I/O).

Each history's deliveries reach the stack in its arrival order: webhooks signed over HTTP to the
ingest, correlations with PUT /correlations/pg/deposits/{id}, fetched answers (card ``synced``
events, pg backfills) appended to orderly.raw with the fetcher's headers. A history's deliveries
go one after another (each acknowledged before the next); histories run side by side. Then the
PostgreSQL read models are polled until they agree with the oracle or the deadline passes, and,
when the caller has the merchant's endpoint (a test's stub), the effects it was delivered too.

Compared: each resource's row, the effects recorded (and delivered: each key exactly once), the
facts' tables, and the deliveries still parked. Not compared here: pg sequence gaps (the stack's
sequence space is shared by every history) and anything timed by the stack's own clock.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TextIO

import aiohttp
import asyncpg
import orjson

from app.kafka_client import client_options
from app.producer import KeyedProducer
from app.settings import Settings
from app.simulator import check, truths
from app.simulator.deliver import signed_body, signed_headers
from app.simulator.histories import History
from app.simulator.oracle import Outcome
from app.simulator.plugins import row_fields
from projections.migrate import quote_ident
from topics.catalog import names
from topics.records import raw_headers

ROWS = {  # table -> its id column (the columns compared: each gateway simulator's rows)
    "pg_deposits": "pg_deposit_id", "pg_withdrawals": "pg_withdrawal_id", "pg_balance_txns": "btxn_id",
    "card_payments": "payment_ref", "paymos_invoices": "id", "paymos_withdrawals": "id",
    "paymos_channel_deposits": "id", "adyen_payments": "psp_reference",
}
FACTS = {  # kind -> query of (key, owner) for the resources in $1
    "withdrawal_fill": "SELECT leg_ref AS key, pg_withdrawal_id AS owner FROM pg_withdrawal_fills",
    "overpayment_flag": "SELECT claim_id AS key, pg_deposit_id AS owner FROM pg_deposit_overpayment_flags",
    "order_note": "SELECT note_key AS key, resource_id AS owner FROM order_notes",
    "card_event_applied": "SELECT gateway_event_id AS key, payment_ref AS owner FROM card_events "
                          "WHERE applied_at IS NOT NULL AND",
}


async def post_history(http: aiohttp.ClientSession, producer: KeyedProducer, settings: Settings, target: str,
                       history: History) -> None:
    """The history's deliveries, in order, each acknowledged before the next."""
    secret = settings.secrets[history.gateway].reveal()[0]
    for n, d in enumerate(history.deliveries):
        if d.source == "webhook":
            async with http.post(f"{target}/webhooks/{history.gateway}",
                                 data=signed_body(history.gateway, d.body, secret),
                                 headers=signed_headers(history.gateway, d.body, secret)) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"webhook of {d.resource}: HTTP {resp.status} {await resp.text()}")
        elif d.source == "correlation":
            async with http.put(f"{target}/correlations/pg/deposits/{d.resource}", data=d.body,
                                headers={"Authorization": f"Bearer {settings.api_token.reveal()}"}) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"correlation of {d.resource}: HTTP {resp.status}")
        else:  # what the fetcher appends: the gateway's answer, as a record of orderly.raw
            headers = raw_headers(history.gateway, f"fetch-{d.resource}-{n}", int(time.time() * 1000), "fetch")
            await producer.send_and_wait(names(settings.namespace).raw, f"{history.gateway}:{d.resource}".encode(),
                                         d.body, headers)


def _resources(history: History) -> set[str]:
    return {e.resource for e in history.events} | {d.resource for d in history.deliveries}


async def read_outcomes(conn: asyncpg.Connection, batch: list[History]) -> dict[str, Outcome]:
    """What the read models say about each history's resources (keyed by history resource ids)."""
    resources = sorted({r for h in batch for r in _resources(h)})
    by_resource: dict[str, Outcome] = {r: Outcome() for r in resources}
    fields = row_fields()
    for table, id_column in ROWS.items():
        columns = ", ".join(fields[table])
        for row in await conn.fetch(f"SELECT {id_column} AS id, {columns} FROM {table} WHERE {id_column} = ANY($1)",
                                    resources):
            by_resource[row["id"]].rows[row["id"]] = {k: row[k] for k in fields[table]}
    for row in await conn.fetch("SELECT dedupe_key, type, resource_id, payload FROM effects "
                                "WHERE resource_id = ANY($1)", resources):
        payload = orjson.loads(row["payload"]) if isinstance(row["payload"], str) else row["payload"]
        amount = payload.get("amount_minor") if row["type"] in check.MONEY_EFFECTS else None
        by_resource[row["resource_id"]].effects.add((row["dedupe_key"], row["type"], amount))
    for kind, query in FACTS.items():
        where = " " if query.endswith("AND") else " WHERE "
        owner = query.split(" AS owner")[0].rsplit(" ", 1)[1]
        for row in await conn.fetch(f"{query}{where}{owner} = ANY($1)", resources):
            by_resource[row["owner"]].facts.add((kind, row["key"]))
    for row in await conn.fetch("SELECT resource_id, count(*) AS n FROM webhook_events WHERE outcome = 'parked' "
                                "AND resource_id = ANY($1) GROUP BY resource_id", resources):
        by_resource[row["resource_id"]].parked[row["resource_id"]] = int(row["n"])
    out = {}
    for history in batch:
        merged = Outcome()
        for r in _resources(history):
            got = by_resource[r]
            merged.rows |= got.rows
            merged.effects |= got.effects
            merged.facts |= got.facts
            merged.parked |= got.parked
        out[f"{history.gateway}:{history.seed}"] = merged
    return out


def wanted(history: History) -> Outcome:
    want = check.expected(history)
    want.outcomes = None  # each delivery's outcomes are compared by the pure check (the stack's ids differ)
    want.gaps = set()
    return want


async def run_stack(settings: Settings, target: str, gateways: list[str], count: int, seed: int, tag: str,
                    out: TextIO, delivered: Callable[[], Counter[str]] | None = None, timeout_s: float = 120.0,
                    concurrency: int = 24) -> tuple[int, int]:
    """Every gateway's ``count`` histories through the stack at ``target``; (histories, mismatches)."""
    batch = [truths.make(g, seed + i, tag) for g in gateways for i in range(count)]
    expected = {f"{h.gateway}:{h.seed}": wanted(h) for h in batch}
    started = time.monotonic()
    producer = KeyedProducer(settings.kafka_bootstrap, **client_options(settings))
    await producer.start()
    try:
        queue: asyncio.Queue[History] = asyncio.Queue()
        for h in batch:
            queue.put_nowait(h)

        async def worker(http: aiohttp.ClientSession) -> None:
            while not queue.empty():
                await post_history(http, producer, settings, target, queue.get_nowait())

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    finally:
        await producer.stop()
    posted_s = time.monotonic() - started
    conn = await asyncpg.connect(settings.postgres_dsn.reveal(),
                                 server_settings={"search_path": quote_ident(settings.namespace)})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            got = await read_outcomes(conn, batch)
            wrong = {k: want.differences(got[k]) for k, want in expected.items() if want.differences(got[k])}
            keys = Counter[str]() if delivered is None else delivered()
            want_keys = {e[0] for want in expected.values() for e in want.effects}
            stub_ok = delivered is None or {k: n for k, n in keys.items() if tag in k or k in want_keys} \
                == dict.fromkeys(want_keys, 1)
            if (not wrong and stub_ok) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        await conn.close()
    for h in batch:
        why = wrong.get(f"{h.gateway}:{h.seed}")
        if why:
            print(f"  MISMATCH (stack) {h.gateway} seed={h.seed} tag={tag!r}; core alone: orderly simulate --check "
                  f"--gateway {h.gateway} --seed {h.seed} --histories 1", file=out)
            for line in why[:6]:
                print(f"    {line}", file=out)
    bad = len(wrong)
    if not stub_ok:
        extra = {k: n for k, n in keys.items() if (tag in k or k in want_keys) and n != 1}
        missing = sorted(want_keys - set(keys))[:10]
        print(f"  merchant deliveries: not exactly once per expected key (missing {missing}, "
              f"other counts {dict(list(extra.items())[:10])})", file=out)
        bad += 1
    print(f"stack: {len(batch)} histories, {sum(len(h.deliveries) for h in batch)} deliveries posted in "
          f"{posted_s:.1f} s, settled in {time.monotonic() - started:.1f} s", file=out)
    print(f"check: histories={len(batch)} mismatches={bad}", file=out)
    return len(batch), bad


def run(settings: Settings, target: str, gateways: list[str], count: int, seed: int, tag: str, out: TextIO,
        **options: Any) -> tuple[int, int]:
    return asyncio.run(run_stack(settings, target, gateways, count, seed, tag, out, **options))
