"""The pg document's own design, as the baseline: its applyDepositEvent, statement for statement,
applying each webhook inside one PostgreSQL transaction (inbox insert, correlation lookup, the
16-column version-guarded upsert, the credit/reversal guards, the users balance and an outbox row
for every branch of the status switch) before answering 200. Same signature check, same events,
same machine."""

from __future__ import annotations

import sys
import time
from typing import Any

import asyncpg
import orjson
from aiohttp import web

from app.gateways import pg
from app.gateways.base import SignatureError
from app.process_setup import tune_gc
from app.settings import dev_settings

SCHEMA = """
CREATE TABLE IF NOT EXISTS pg_webhook_inbox (event_id text PRIMARY KEY, event_type text NOT NULL,
  event jsonb NOT NULL, received_at timestamptz NOT NULL DEFAULT now(), processed_at timestamptz);
CREATE TABLE IF NOT EXISTS pg_outbox (dedupe_key text PRIMARY KEY, topic text NOT NULL, payload jsonb NOT NULL);
CREATE TABLE IF NOT EXISTS users (id text PRIMARY KEY, balance_minor bigint NOT NULL DEFAULT 0);
"""
UPSERT = """
INSERT INTO pg_deposits (pg_deposit_id, pg_version, status, is_terminal, late_slip_accepted_until,
                         ordered_amount_minor, transferred_amount_minor, amount_received_minor, fee_total_minor,
                         credited_amount_minor, fee_breakdown, overpayment, balance_transaction_id,
                         clearing_available_at, our_order_id, our_user_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12::jsonb, $13, $14, $15, $16)
ON CONFLICT (pg_deposit_id) DO UPDATE
  SET pg_version = EXCLUDED.pg_version, status = EXCLUDED.status, is_terminal = EXCLUDED.is_terminal,
      late_slip_accepted_until = EXCLUDED.late_slip_accepted_until,
      ordered_amount_minor = EXCLUDED.ordered_amount_minor,
      transferred_amount_minor = EXCLUDED.transferred_amount_minor,
      amount_received_minor = EXCLUDED.amount_received_minor, fee_total_minor = EXCLUDED.fee_total_minor,
      credited_amount_minor = EXCLUDED.credited_amount_minor, fee_breakdown = EXCLUDED.fee_breakdown,
      overpayment = EXCLUDED.overpayment, balance_transaction_id = EXCLUDED.balance_transaction_id,
      clearing_available_at = EXCLUDED.clearing_available_at, updated_at = now()
  WHERE pg_deposits.pg_version < EXCLUDED.pg_version"""
PROCESSED = "UPDATE pg_webhook_inbox SET processed_at = now() WHERE event_id = $1 AND processed_at IS NULL"


def _json(value: object) -> str:
    return orjson.dumps(value).decode()


async def enqueue_effect(conn: Any, scope: str, topic: str, payload: dict[str, object]) -> None:
    await conn.execute("INSERT INTO pg_outbox (dedupe_key, topic, payload) VALUES ($1, $2, $3::jsonb) "
                       "ON CONFLICT DO NOTHING", f"{scope}:{topic}", topic, _json(payload))


async def handle(request: web.Request) -> web.Response:
    raw = await request.read()
    try:
        pg.verify(raw, request.headers, request.app["secrets"], time.time())
    except SignatureError:
        return web.Response(status=401)
    event = orjson.loads(raw)
    o = event["data"]["object"]
    pool: asyncpg.Pool = request.app["pool"]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO pg_webhook_inbox (event_id, event_type, event) VALUES ($1, $2, $3::jsonb) "
                           "ON CONFLICT DO NOTHING", event["id"], event["type"], raw.decode())
        corr = await conn.fetchrow("SELECT our_order_id, our_user_id FROM pg_deposit_correlations "
                                   "WHERE pg_deposit_id = $1", o["id"])
        if corr is None:
            return web.Response(status=409)  # the document: fail, the gateway retries later
        status = await conn.execute(
            UPSERT, o["id"], o["version"], o["status"], o.get("is_terminal"), o.get("late_slip_accepted_until"),
            o.get("ordered_amount_minor"), o.get("transferred_amount_minor"), o.get("amount_received_minor"),
            o.get("fee_total_minor"), o.get("credited_amount_minor"), _json(o.get("fee_breakdown")),
            _json(o.get("overpayment")), o.get("balance_transaction_id"), o.get("clearing_available_at"),
            corr["our_order_id"], corr["our_user_id"])
        # (the document's overpayment-flag append goes here; these events carry no flag)
        if status.endswith(" 0"):  # older than what is held: no side effect
            await conn.execute(PROCESSED, event["id"])
            return web.json_response({"status": "stale"})
        order_id, user_id = corr["our_order_id"], corr["our_user_id"]
        match o["status"]:
            case "settled":
                credited = await conn.execute(
                    "UPDATE pg_deposits SET credited_user_at = now() WHERE pg_deposit_id = $1 "
                    "AND status = 'settled' AND credited_user_at IS NULL", o["id"])
                if credited.endswith(" 1"):
                    await conn.execute("UPDATE users SET balance_minor = balance_minor + $1 WHERE id = $2",
                                       o["amount_received_minor"], user_id)
                    await enqueue_effect(conn, f"deposit:{o['id']}", "release_goods", {
                        "order_id": order_id, "partial": o.get("partial") is True,
                        "received": o["amount_received_minor"], "ordered": o.get("ordered_amount_minor")})
            case "reversed":
                reversed_row = await conn.fetchrow(
                    "UPDATE pg_deposits SET reversed_at = now() WHERE pg_deposit_id = $1 AND status = 'reversed' "
                    "AND credited_user_at IS NOT NULL AND reversed_at IS NULL RETURNING amount_received_minor",
                    o["id"])
                if reversed_row is not None:
                    await conn.execute("UPDATE users SET balance_minor = balance_minor - $1 WHERE id = $2",
                                       reversed_row["amount_received_minor"], user_id)
                    await enqueue_effect(conn, f"deposit:{o['id']}", "hold_goods", {"order_id": order_id})
            case "expired" | "canceled":
                if o.get("is_terminal") is False and o.get("late_slip_accepted_until"):
                    await enqueue_effect(conn, event["id"], "show_late_slip",
                                         {"order_id": order_id, "until": o["late_slip_accepted_until"]})
                else:
                    await enqueue_effect(conn, event["id"], "fail_order",
                                         {"order_id": order_id, "reason": o.get("cancel_reason_code") or "expired"})
            case "under_review":
                await enqueue_effect(conn, event["id"], "show_pending_review",
                                     {"order_id": order_id, "message": o["review"]["reasons"][0]["display_th"]})
            case "rejected":
                await enqueue_effect(conn, event["id"], "fail_order",
                                     {"order_id": order_id, "reason": (o.get("rejection") or {}).get("display_th")})
            case _:  # the document's default branch: a status the enum may gain later
                await enqueue_effect(conn, event["id"], "update_order_status",
                                     {"order_id": order_id, "status": o["status"]})
        await conn.execute(PROCESSED, event["id"])
    return web.json_response({"status": "applied"})


async def build(dsn: str, schema: str, secret: str) -> web.Application:
    app = web.Application()
    app["secrets"] = (secret,)
    app["pool"] = await asyncpg.create_pool(dsn, min_size=4, max_size=16, server_settings={"search_path": schema})
    async with app["pool"].acquire() as conn:
        await conn.execute(SCHEMA)
    app.router.add_post("/webhooks/pg", handle)
    return app


if __name__ == "__main__":
    import uvloop

    uvloop.install()  # Orderly's processes run on uvloop (ORDERLY_LOOP): the baseline gets the same loop
    tune_gc(dev_settings().gc_threshold)  # and the same garbage-collector setting
    dsn, schema, secret, port = sys.argv[1:5]
    web.run_app(build(dsn, schema, secret), host="127.0.0.1", port=int(port), access_log=None, print=None)
