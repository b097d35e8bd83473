"""What no stage can handle is set aside, never looped on (issue #16, DESIGN.md §2.4): over HTTP →
Kafka → worker → PostgreSQL, each stage's set-aside record lands in the quarantine table with its
reason and in the resource's timeline, the stage goes on (a canary behind it on the same partition
is decided, no process restarts), the sweeper never appends it again, and `orderly quarantine`
lists, shows and redrives it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from app.producer import KeyedProducer
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.pg_events import deposit, withdrawal
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings, read_topic
from topics.catalog import names
from topics.partitioning import partition_for
from topics.records import H_CHECKED, correlation_headers, raw_headers


def orderly(pipe: Running, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env={**os.environ, **pipe.settings.to_env()},
                          capture_output=True, text=True, timeout=60, check=False)


def same_partition(resource: str, prefix: str, partitions: int) -> str:
    """Another pg deposit id whose records share ``resource``'s partition (the canary's)."""
    want = partition_for(f"pg:{resource}".encode(), partitions)
    return next(f"{prefix}{i}" for i in range(10_000) if partition_for(f"pg:{prefix}{i}".encode(), partitions) == want)


async def append_raw(pipe: Running, resource: str, body: bytes, delivery_id: str, correlation: bool = False,
                     checked: bool = False) -> None:
    """What an older log, a bug or a redrive can hold although the ingest's validation refuses it;
    ``checked`` marks it as validated by the ingest (a bug that let it through), so the worker trusts it."""
    producer = KeyedProducer(pipe.settings.kafka_bootstrap)
    await producer.start()
    try:
        now_ms = int(time.time() * 1000)
        headers = (correlation_headers("pg", delivery_id, now_ms) if correlation
                   else raw_headers("pg", delivery_id, now_ms))
        if checked:
            headers.append((H_CHECKED, b"1"))
        await producer.send_and_wait(names(pipe.settings.namespace).raw, f"pg:{resource}".encode(), body, headers)
    finally:
        await producer.stop()


def test_every_stage_sets_aside_what_it_cannot_handle_and_goes_on(
        kafka: KafkaBroker, postgres: PostgresServer, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"q{uuid.uuid4().hex[:8]}", sweep_after_s=2.0)
    with running_pipeline(s, tmp_path) as pipe:
        pids = {name: proc.pid for name, proc in pipe.pipeline.procs.items()}

        async def drive() -> dict[str, Any]:
            # the ingest: a validly signed body of the wrong shape is answered 200 and quarantined
            answer = (await pipe.post("pg", deposit("dep_qi", 4, "under_review", review="a string")))[0]
            assert answer["quarantined"] is True and "data.object.review" in answer["reason"]
            # the worker: the same shape from the log, for a correlated deposit, then a canary behind it
            await append_raw(pipe, "dep_qw", orjson.dumps({"pg_deposit_id": "dep_qw", "merchant_reference": "mr_qw",
                                                           "our_order_id": "o_qw", "our_user_id": "u_qw"}),
                             "corr-qw", correlation=True)
            await append_raw(pipe, "dep_qw", deposit("dep_qw", 4, "under_review", review="a string"), "poison-w")
            await append_raw(pipe, "dep_qc", b"\xff not a correlation", "poison-c", correlation=True)
            await pipe.canary(same_partition("dep_qw", "dep_cw", s.partitions))
            # the projector: a NUL in a field Orderly does not read, which the ingest let through (a
            # bug): the worker's typed read takes it, PostgreSQL's jsonb refuses it
            await append_raw(pipe, "wdr_qp", withdrawal("wdr_qp", 7, "filling", 400_000,
                                                        fill={"leg_ref": "leg_qp", "amount_minor": 400_000,
                                                              "note": "a\x00b"}),
                             "poison-p", checked=True)
            await pipe.canary(same_partition("wdr_qp", "dep_cp", s.partitions))
            query = "SELECT delivery_id, stage, gateway, resource_id, reason FROM quarantine"

            async def three(c: Any) -> list[Any] | None:
                found = await c.fetch(query)
                return found if len(found) >= 4 else None

            rows = await pipe.wait_for(three, timeout=30)
            return {r["resource_id"]: dict(r) for r in rows}

        found = asyncio.run(drive())
        assert {resource: row["stage"] for resource, row in found.items()} == {
            "dep_qi": "ingest", "dep_qw": "worker", "dep_qc": "worker", "wdr_qp": "projector"}
        assert "data.object.review" in found["dep_qi"]["reason"]
        # not through the ingest: the worker applies the same typed check, and sets it aside with its reason
        assert found["dep_qw"]["delivery_id"] == "poison-w" and "data.object.review" in found["dep_qw"]["reason"]
        assert found["dep_qc"]["delivery_id"] == "poison-c" and "JSONDecodeError" in found["dep_qc"]["reason"]
        assert found["wdr_qp"]["delivery_id"] == "poison-p" and "Unicode escape" in found["wdr_qp"]["reason"]
        # no restart: every process still the one started
        pipe.pipeline.assert_alive()
        assert {name: proc.pid for name, proc in pipe.pipeline.procs.items()} == pids

        async def timeline(resource: str) -> list[tuple[str, str]]:
            status, body = await pipe.resource("pg", resource)
            assert status == 200
            return [(d["delivery_id"], d["outcome"]) for d in body["timeline"]]

        assert ("poison-w", "quarantined") in asyncio.run(timeline("dep_qw"))
        assert [outcome for _, outcome in asyncio.run(timeline("dep_qi"))] == ["quarantined"]

        # the sweeper never appends a set-aside record again by itself. Proven by a positive signal,
        # not a sleep: the sweeper stores how far it has looked (projector_offsets, consumer
        # "sweeper") and moves past a record only once it found it handled — decided or set aside
        raw = asyncio.run(read_topic(s.kafka_bootstrap, names(s.namespace).raw))
        poison = {r.headers["delivery_id"]: r for r in raw if r.headers.get("delivery_id") in ("poison-w", "poison-p")}
        assert set(poison) == {"poison-w", "poison-p"}

        async def swept_past(conn: asyncpg.Connection) -> bool:
            for record in poison.values():
                stored = await conn.fetchval(
                    "SELECT next_offset FROM projector_offsets WHERE consumer = 'sweeper' AND topic = $1 "
                    "AND partition = $2", record.topic, record.partition)
                if stored is None or stored <= record.offset:
                    return False
            return True

        asyncio.run(pipe.wait_for(swept_past))  # the sweeper's position past both set-aside records
        raw = asyncio.run(read_topic(s.kafka_bootstrap, names(s.namespace).raw))
        copies = [r.headers.get("delivery_id") for r in raw]
        assert copies.count("poison-w") == 1 and copies.count("poison-p") == 1

        listed = orderly(pipe, "quarantine", "list")
        assert listed.returncode == 0 and "poison-w" in listed.stdout and "4 record(s)" in listed.stdout, listed
        shown = orderly(pipe, "quarantine", "show", "poison-w")
        assert shown.returncode == 0 and "stage: worker" in shown.stdout and '"review": "a string"' in shown.stdout
        # a webhook body the adapter still refuses is not appended again: a clear message instead
        for delivery_id in (found["dep_qi"]["delivery_id"], "poison-w"):
            refused = orderly(pipe, "quarantine", "redrive", delivery_id)
            assert refused.returncode == 1 and "still refused" in refused.stderr, refused
            assert "data.object.review" in refused.stderr
        # another is appended again under a new delivery id naming the original, and decided (here:
        # set aside once more, as nothing was fixed)
        redriven = orderly(pipe, "quarantine", "redrive", "poison-c")
        assert redriven.returncode == 0 and "poison-c~r1" in redriven.stdout, redriven
        asyncio.run(pipe.wait_for(lambda c: c.fetchval(
            "SELECT outcome = 'quarantined' FROM webhook_events WHERE delivery_id = 'poison-c~r1'")))
        asyncio.run(pipe.wait_for(lambda c: c.fetchval(
            "SELECT redrives = 1 AND redriven_at IS NOT NULL FROM quarantine WHERE delivery_id = 'poison-c'")))
        assert orderly(pipe, "quarantine", "show", "nope").returncode == 1
        pipe.pipeline.assert_alive()
        assert {name: proc.pid for name, proc in pipe.pipeline.procs.items()} == pids
