"""The outbox rule end to end: "The outbox worker ... sends dedupe_key as the idempotency key on every
attempt" (gateway-docs/pg-event-order-version-guard.txt; DESIGN.md §3.2). The effects worker is
killed (kill -9) after the merchant received a POST and before the worker could mark it delivered:
the merchant stub itself kills it when that request arrives, keeps the request and answers nothing.
Started again, the worker sends that effect again with the same Idempotency-Key once its lease has
run out; every other effect goes out once, and every row ends delivered."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.pg_events import deposit
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings

LEASE_S = 6.0  # a claimed row is claimed again after this long (ORDERLY_EFFECTS_LEASE_S); its half,
# the request timeout, leaves the merchant stub (a thread of the busy pytest process) 3 s to answer


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    # one request in flight at a time: when the chosen one is killed, no other is half done
    s = make_settings(kafka.bootstrap, postgres.dsn, f"re{uuid.uuid4().hex[:8]}", effects_lease_s=LEASE_S,
                      effects_timeout_s=LEASE_S / 2,  # a request must end within its lease
                      effects_concurrency=1)
    with running_pipeline(s, tmp_path_factory.mktemp("rules-effects")) as running:
        yield running


async def settle(pipe: Running, deps: list[str]) -> list[str]:
    """Correlated deposits settled through the ingest; the dedupe keys the document gives them."""
    await pipe.correlate(deps)
    await pipe.post("pg", *(deposit(dep, 3, "settled") for dep in deps))
    # settled: credit the end user, release the goods, each under deposit:{id}:{type}
    return sorted(f"deposit:{dep}:{kind}" for dep in deps for kind in ("credit_user", "release_goods"))


async def test_a_worker_killed_between_the_post_and_marking_it_sends_it_again_with_the_same_key(
        pipe: Running) -> None:
    victim = pipe.pipeline.procs["effects"]
    chosen = "deposit:dep_kill1:credit_user"
    killed = threading.Event()

    def kill_on_chosen(key: str) -> bool:  # in the stub's thread, when a request has been counted
        if key != chosen or killed.is_set():
            return False
        os.kill(victim.pid, signal.SIGKILL)  # before any answer: the worker cannot have marked it
        killed.set()
        return True  # and no answer

    pipe.stub.on_request = kill_on_chosen
    try:
        keys = await settle(pipe, ["dep_kill0", "dep_kill1", "dep_kill2"])
        assert chosen in keys
        deadline = time.monotonic() + 60
        while not (killed.is_set() and victim.poll() is not None):
            assert time.monotonic() < deadline, "the chosen effect was never sent"
            await asyncio.sleep(0.1)
        assert victim.returncode == -signal.SIGKILL
        conn = await pipe.connect()
        try:
            row = await conn.fetchrow("SELECT * FROM effects WHERE dedupe_key = $1", chosen)
        finally:
            await conn.close()
        assert row is not None and (row["delivered_at"], row["dead_at"]) == (None, None)  # the merchant has it

        pipe.pipeline.kill("effects")  # reaped (it is already dead)
        pipe.pipeline.start("effects")

        async def all_delivered(conn: Any) -> list[Any] | None:
            rows = await conn.fetch("SELECT * FROM effects WHERE dedupe_key = ANY($1) AND delivered_at IS NOT NULL",
                                    keys)
            return rows if len(rows) == len(keys) else None
        rows = await pipe.wait_for(all_delivered, timeout=60)
    finally:
        pipe.stub.on_request = None

    # the chosen effect reached the merchant twice under its one Idempotency-Key (the stub checks
    # that Idempotency-Key equals webhook-id, which it counts by); every other exactly once
    assert {k: pipe.stub.requests[k] for k in keys} == {k: 2 if k == chosen else 1 for k in keys}
    assert {k: pipe.stub.deliveries[k] for k in keys} == dict.fromkeys(keys, 1)  # the 2xx: the second time
    assert sorted(r["dedupe_key"] for r in rows) == keys
    assert all(r["dead_at"] is None and r["last_error"] is None for r in rows)
