"""Effects delivery end to end (DESIGN.md §3.2): pg deposits through the real pipeline, the effects
process POSTing to a stub merchant that verifies every Standard Webhooks signature. Retries after
failures still deliver each effect once, an effect refused to the last attempt ends dead, and no
more than ORDERLY_EFFECTS_CONCURRENCY requests are ever in flight."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from tests.pg_events import deposit
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings

EFFECT_KINDS = ("credit_user", "release_goods")  # what a correlated deposit's settlement emits


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"fx{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path_factory.mktemp("effects-delivery")) as running:
        yield running


def restart_effects(pipe: Running, **env: str) -> None:
    """The effects process again, with ``env`` on top of the pipeline's settings (every earlier test
    has waited for its effects to be settled, so nothing is in flight when it stops)."""
    pipe.pipeline.terminate("effects")
    pipe.pipeline.start("effects", **env)


async def settle_deposits(pipe: Running, prefix: str, count: int) -> list[str]:
    """``count`` correlated deposits settled through the ingest; their effects' dedupe keys."""
    deps = [f"dep_{prefix}{i}" for i in range(count)]
    await pipe.correlate(deps)
    await pipe.post("pg", *(deposit(dep, 3, "settled") for dep in deps))
    return sorted(f"deposit:{dep}:{kind}" for dep in deps for kind in EFFECT_KINDS)


async def effect_rows(pipe: Running, keys: list[str], settled: str, timeout: float = 60.0) -> dict[str, Any]:
    """The effects rows of ``keys`` once each has ``settled`` (``delivered_at`` or ``dead_at``) set."""
    async def check(conn: Any) -> dict[str, Any] | None:
        rows = await conn.fetch(f"SELECT * FROM effects WHERE dedupe_key = ANY($1) AND {settled} IS NOT NULL",
                                keys)
        return {r["dedupe_key"]: r for r in rows} if len(rows) == len(keys) else None
    result: dict[str, Any] = await pipe.wait_for(check, timeout=timeout)
    return result


async def scrape(port: int, timeout: float = 30.0) -> dict[str, float]:
    """The effects process's unlabelled samples, once its /metrics answers."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    text = await resp.text()
                    break
            except aiohttp.ClientConnectionError:
                assert time.monotonic() < deadline, "the effects process serves no /metrics"
                await asyncio.sleep(0.2)
    samples = (line.split(" ") for line in text.splitlines() if line and not line.startswith("#"))
    return {parts[0]: float(parts[1]) for parts in samples if len(parts) == 2}


async def test_failed_attempts_are_retried_and_each_effect_is_delivered_once(pipe: Running) -> None:
    restart_effects(pipe)
    pipe.stub.behave(fail_first=4)
    keys = await settle_deposits(pipe, "retry", 3)
    rows = await effect_rows(pipe, keys, "delivered_at")

    assert pipe.stub.rejected == []
    assert {k: pipe.stub.deliveries[k] for k in keys} == dict.fromkeys(keys, 1)
    assert sum(pipe.stub.refused[k] for k in keys) == 4  # the first four requests, whichever effects they were
    assert {k: r["attempts"] for k, r in rows.items()} == {k: pipe.stub.refused[k] + 1 for k in keys}
    assert {k: pipe.stub.requests[k] for k in keys} == {k: r["attempts"] for k, r in rows.items()}
    assert any(r["attempts"] > 1 for r in rows.values())
    assert all(r["dead_at"] is None and r["last_error"] is None for r in rows.values())


async def test_an_effect_refused_to_the_last_attempt_is_dead(pipe: Running) -> None:
    restart_effects(pipe, ORDERLY_EFFECTS_MAX_ATTEMPTS="2")
    pipe.stub.behave(refuse_with=500)
    keys = await settle_deposits(pipe, "dead", 1)
    rows = await effect_rows(pipe, keys, "dead_at")

    assert pipe.stub.rejected == []
    assert {k: (r["attempts"], r["last_error"], r["delivered_at"]) for k, r in rows.items()} \
        == dict.fromkeys(keys, (2, "HTTP 500", None))
    assert {k: (pipe.stub.requests[k], pipe.stub.refused[k], pipe.stub.deliveries[k]) for k in keys} \
        == dict.fromkeys(keys, (2, 2, 0))


async def test_no_more_than_the_concurrency_is_in_flight(pipe: Running) -> None:
    port = spare_port()
    restart_effects(pipe, ORDERLY_EFFECTS_CONCURRENCY="4", ORDERLY_METRICS_PORT=str(port))
    pipe.stub.behave(hold_s=0.5)
    keys = await settle_deposits(pipe, "many", 6)
    rows = await effect_rows(pipe, keys, "delivered_at")

    assert pipe.stub.rejected == []
    assert {k: pipe.stub.deliveries[k] for k in keys} == dict.fromkeys(keys, 1)
    assert all(r["attempts"] == 1 for r in rows.values())
    assert 1 < pipe.stub.max_concurrent <= 4
    metrics = await scrape(port)
    assert (metrics["orderly_effects_concurrency"], metrics["orderly_effects_in_flight"]) == (4.0, 0.0)
    assert metrics["orderly_effects_request_seconds_count"] == len(keys)


async def test_delivery_without_a_secret_refuses_to_start(pipe: Running) -> None:
    pipe.pipeline.start("effects-unsigned", command="effects", ORDERLY_EFFECTS_SECRET="")
    proc = pipe.pipeline.procs.pop("effects-unsigned")  # an exit is expected: not one the pipeline watches
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    log = pipe.pipeline.log("effects-unsigned")
    assert proc.returncode == 2, log[-2000:]
    assert "ORDERLY_EFFECTS_URL is set but ORDERLY_EFFECTS_SECRET is not" in log
