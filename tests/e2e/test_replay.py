"""`orderly replay --into NS`: the log rebuilds the same read models, effects are recorded but not
delivered, and a difference is reported when there is one."""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import time
import uuid
from pathlib import Path

import aiohttp
import orjson

from app.replay import diff, replay
from app.simulator import card as card_simulator
from app.simulator import lifecycles
from app.simulator import paymos as paymos_simulator
from app.simulator import pg as pg_simulator
from app.simulator.deliver import Chaos, deliver
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings, read_topic
from topics.catalog import names


async def effects_settled(pipe: Running, limit_s: float = 60) -> None:
    """Until the effects table holds every effect the worker emitted to orderly.effects, each one
    delivered, and the merchant received exactly those: nothing is still on its way to be recorded
    or delivered when the replay starts (and could pass for a delivery the replay made)."""
    deadline = time.monotonic() + limit_s
    conn = await pipe.connect()
    try:
        while True:
            emitted = {r.key.decode() for r in await read_topic(pipe.settings.kafka_bootstrap,
                                                                 names(pipe.settings.namespace).effects) if r.key}
            rows = {r["dedupe_key"]: r["delivered_at"] for r in await conn.fetch(
                "SELECT dedupe_key, delivered_at FROM effects")}
            if emitted and set(rows) == emitted and None not in rows.values() \
                    and set(pipe.stub.deliveries) == emitted:
                return
            assert time.monotonic() < deadline, (f"{len(emitted)} emitted, {len(rows)} recorded, "
                                                 f"{sum(v is None for v in rows.values())} undelivered, "
                                                 f"{len(pipe.stub.deliveries)} received")
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


def test_replay_rebuilds_the_same_read_models(kafka: KafkaBroker, postgres: PostgresServer, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"live{uuid.uuid4().hex[:8]}")
    rng = random.Random(3)
    truth = lifecycles.Truth()
    events = (pg_simulator.lifecycle(rng, 40, 10, truth) + card_simulator.lifecycle(rng, 30, truth)
              + paymos_simulator.lifecycle(rng, 15, truth))
    with running_pipeline(s, tmp_path) as pipe:
        async def drive() -> None:
            token = pipe.settings.api_token.reveal()
            async with aiohttp.ClientSession() as http:
                for dep, body in truth.correlations.items():
                    async with http.put(f"{pipe.ingest.url}/correlations/pg/deposits/{dep}", data=orjson.dumps(body),
                                        headers={"Authorization": f"Bearer {token}"}) as resp:
                        assert resp.status == 200
            secrets = {g: v.reveal()[0] for g, v in pipe.settings.secrets.items()}
            stats = await deliver(pipe.ingest.url, events, secrets, rng,
                                  Chaos(time_scale=1 / 200))
            assert not stats.given_up
            stored = sum(stats.accepted.values()) + len(truth.correlations)  # one timeline row per delivery id
            decided = await pipe.wait_for(lambda c: c.fetchval(
                "SELECT count(*) FROM webhook_events HAVING count(*) >= $1", stored))
            assert decided == stored
            await effects_settled(pipe)
        asyncio.run(drive())
        delivered_before = sum(pipe.stub.deliveries.values())

        into = f"rb{uuid.uuid4().hex[:8]}"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = replay(pipe.settings, into, tmp_path / "replay")
        assert code == 0, out.getvalue()
        assert "no difference from the live namespace" in out.getvalue()
        assert sum(pipe.stub.deliveries.values()) == delivered_before  # nothing delivered again

        target = pipe.settings.with_overrides(namespace=into)

        async def tamper() -> dict[str, tuple[int, int]]:
            conn = await pipe.connect()
            try:
                await conn.execute("UPDATE card_payments SET state = 'voided' WHERE payment_ref = 'pay_sim0'")
            finally:
                await conn.close()
            return await diff(pipe.settings, target)
        assert asyncio.run(tamper())["card_payments"] == (1, 1)


def test_orderly_simulate_drives_an_ingest(kafka: KafkaBroker, postgres: PostgresServer, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    s = make_settings(kafka.bootstrap, postgres.dsn, f"sim{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path) as pipe:
        env = {**os.environ, **pipe.settings.to_env()}
        result = subprocess.run([sys.executable, "-m", "app.cli", "simulate", "--gateway", "card", "--target",
                                 pipe.ingest.url, "--count", "12", "--time-scale", "0.005"],
                                env=env, capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        line = next(row for row in result.stdout.splitlines() if row.startswith("card:"))
        # accepted: every event at least once (the simulator redelivers some at random: a lower bound)
        assert "0 given up" in line and int(line.split()[3]) >= 12 * 2
        asyncio.run(pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 12 FROM card_payments")))
