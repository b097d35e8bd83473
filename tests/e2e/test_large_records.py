"""The largest valid bodies go through every stage (issue #16, size limits that fit together): a
body just under 1 MiB per gateway, and three 400 KB deposits parked together before their
correlation (their state then holds 1.2 MB of parked bodies; it once crashed the worker three
times). Every one is decided and projected, and no process restarts."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import aiohttp
import orjson

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.paymos_events import event
from tests.pg_events import deposit
from tests.pipeline import running_pipeline
from tests.support import make_settings

MIB = 1024 * 1024


def padded(body: bytes, size: int) -> bytes:
    """``body`` with an extra top-level field that brings it to ``size`` bytes (gateways add fields)."""
    decoded = orjson.loads(body)
    decoded["padding"] = ""
    decoded["padding"] = "x" * (size - len(orjson.dumps(decoded)))
    out = orjson.dumps(decoded)
    assert len(out) == size
    return out


def test_the_largest_valid_bodies_are_decided_and_projected(
        kafka: KafkaBroker, postgres: PostgresServer, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"big{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path) as pipe:
        pids = {name: proc.pid for name, proc in pipe.pipeline.procs.items()}

        async def drive() -> None:
            # three 400 KB snapshots of one deposit, parked: its correlation comes after them
            await pipe.post("pg", *(padded(deposit("dep_big", v, status), 400_000)
                                    for v, status in ((1, "pending"), (2, "slip_received"), (3, "settled"))))
            await pipe.wait_for(lambda c: c.fetchval(
                "SELECT count(*) = 3 FROM webhook_events WHERE resource_id = 'dep_big' AND outcome = 'parked'"))
            async with aiohttp.ClientSession() as http:
                for dep in ("dep_big", "dep_mib"):
                    async with http.put(f"{pipe.ingest.url}/correlations/pg/deposits/{dep}",
                                        data=orjson.dumps({"merchant_reference": f"mr_{dep}", "our_order_id": "o",
                                                           "our_user_id": f"u_{dep}"}),
                                        headers={"Authorization": f"Bearer {s.api_token.reveal()}"}) as resp:
                        assert resp.status == 200
            # one body just under 1 MiB per gateway
            await pipe.post("pg", padded(deposit("dep_mib", 1, "pending"), MIB - 1))
            await pipe.post("card", padded(orjson.dumps({
                "id": "evt_mib", "type": "payment.authorised", "payment_ref": "pay_mib", "sequence": None,
                "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": 8000, "currency": "EUR"}), MIB - 1))
            await pipe.post("paymos", padded(event("invoice.confirming", "inv_mib", "confirming", 1_764_412_395_000),
                                             MIB - 1))
            await pipe.wait_for(lambda c: c.fetchval(
                "SELECT status = 'settled' AND pg_version = 3 FROM pg_deposits WHERE pg_deposit_id = 'dep_big'"))
            assert await pipe.wait_for(lambda c: c.fetchval(
                "SELECT count(*) = 3 FROM webhook_events WHERE resource_id = 'dep_big' AND outcome = 'unparked'"))
            await pipe.wait_for(lambda c: c.fetchval(
                "SELECT (SELECT count(*) FROM pg_deposits WHERE pg_deposit_id = 'dep_mib')"
                " + (SELECT count(*) FROM card_payments WHERE payment_ref = 'pay_mib')"
                " + (SELECT count(*) FROM paymos_invoices WHERE id = 'inv_mib') = 3"))
            conn = await pipe.connect()
            try:
                assert await conn.fetchval("SELECT count(*) FROM quarantine") == 0
                assert await conn.fetchval("SELECT sum(amount_minor) FROM ledger_entries WHERE user_id = 'u_dep_big'") \
                    == orjson.loads(deposit("dep_big", 3, "settled"))["data"]["object"]["amount_received_minor"]
            finally:
                await conn.close()

        asyncio.run(drive())
        pipe.pipeline.assert_alive()
        assert {name: proc.pid for name, proc in pipe.pipeline.procs.items()} == pids
