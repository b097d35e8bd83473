"""The pg document's own design, as the baseline: a handler that applies each webhook inside one
PostgreSQL transaction (inbox insert, correlation lookup, version-guarded upsert, credit guard,
outbox insert) before answering 200. Same signature check, same events, same machine."""

from __future__ import annotations

import sys
import time

import asyncpg
import orjson
from aiohttp import web

from app.gateways import pg
from app.gateways.base import SignatureError

SCHEMA = """
CREATE TABLE IF NOT EXISTS pg_webhook_inbox (event_id text PRIMARY KEY, event_type text NOT NULL,
  event jsonb NOT NULL, received_at timestamptz NOT NULL DEFAULT now(), processed_at timestamptz);
CREATE TABLE IF NOT EXISTS pg_outbox (dedupe_key text PRIMARY KEY, topic text NOT NULL, payload jsonb NOT NULL);
CREATE TABLE IF NOT EXISTS users (id text PRIMARY KEY, balance_minor bigint NOT NULL DEFAULT 0);
"""
UPSERT = """
INSERT INTO pg_deposits (pg_deposit_id, pg_version, status, ordered_amount_minor, transferred_amount_minor,
                         amount_received_minor, fee_total_minor, credited_amount_minor, our_order_id, our_user_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (pg_deposit_id) DO UPDATE
  SET pg_version = EXCLUDED.pg_version, status = EXCLUDED.status,
      ordered_amount_minor = EXCLUDED.ordered_amount_minor,
      transferred_amount_minor = EXCLUDED.transferred_amount_minor,
      amount_received_minor = EXCLUDED.amount_received_minor, fee_total_minor = EXCLUDED.fee_total_minor,
      credited_amount_minor = EXCLUDED.credited_amount_minor, updated_at = now()
  WHERE pg_deposits.pg_version < EXCLUDED.pg_version"""


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
        status = await conn.execute(UPSERT, o["id"], o["version"], o["status"], o.get("ordered_amount_minor"),
                                    o.get("transferred_amount_minor"), o.get("amount_received_minor"),
                                    o.get("fee_total_minor"), o.get("credited_amount_minor"),
                                    corr["our_order_id"], corr["our_user_id"])
        if status.endswith(" 1") and o["status"] == "settled":
            credited = await conn.execute(
                "UPDATE pg_deposits SET credited_user_at = now() WHERE pg_deposit_id = $1 "
                "AND status = 'settled' AND credited_user_at IS NULL", o["id"])
            if credited.endswith(" 1"):
                await conn.execute("INSERT INTO users (id, balance_minor) VALUES ($1, $2) ON CONFLICT (id) DO "
                                   "UPDATE SET balance_minor = users.balance_minor + $2",
                                   corr["our_user_id"], o["amount_received_minor"])
                await conn.execute("INSERT INTO pg_outbox (dedupe_key, topic, payload) VALUES ($1, 'release_goods', "
                                   "$2::jsonb) ON CONFLICT DO NOTHING", f"deposit:{o['id']}:release_goods",
                                   orjson.dumps({"order_id": corr["our_order_id"]}).decode())
        await conn.execute("UPDATE pg_webhook_inbox SET processed_at = now() WHERE event_id = $1 "
                           "AND processed_at IS NULL", event["id"])
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
    dsn, schema, secret, port = sys.argv[1:5]
    web.run_app(build(dsn, schema, secret), host="127.0.0.1", port=int(port), access_log=None, print=None)
