"""The worker's state in RocksDB survives restarts: a graceful restart reads it from local disk, and
after kill -9 with the local folder deleted it is rebuilt from the changelog alone. Either way the
recovered state decides exactly as the original would: redeliveries are duplicates, and a reversal
debits only the deposits that were credited before the restart. Both with at-least-once and with
exactly-once, where the changelog goes into the partitions' transactions when they commit (its
restarts are where Faust was seen to skip records: app.worker.exits.OffsetGuard)."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from rocksdict import AccessType, Options, Rdict

from app.bootstrap import prepare
from app.producer import KeyedProducer
from app.settings import Settings
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.worker.store import TABLE, changelog_topic
from tests.pg_events import deposit
from tests.pipeline import Pipeline
from tests.support import make_settings, read_topic
from topics.catalog import names
from topics.records import CORRELATION, correlation_headers, raw_headers

DEPOSITS = 120


def persisted_offsets(data_dir: Path) -> dict[int, int]:
    """The changelog offset each partition's RocksDB says it holds data up to (Faust's offset key)."""
    found = {}
    for path in data_dir.rglob(f"{TABLE}-*.db"):
        db = Rdict(str(path), options=Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            offset = db.get(b"__faust\0offset__")
        finally:
            db.close()
        if offset is not None:
            found[int(path.name.removesuffix(".db").rsplit("-", 1)[1])] = int(offset)
    return found


async def deliver(s: Settings, items: list[tuple[str, str, bytes]]) -> set[str]:
    """(topic, deposit id, body) in order, each with a fresh delivery id; returns the ids. The topic
    CORRELATION stands for a merchant's correlation, appended to orderly.raw as the ingest does."""
    producer = KeyedProducer(s.kafka_bootstrap)
    await producer.start()
    ids = set()
    try:
        for topic, dep, body in items:
            delivery_id, now_ms = uuid.uuid4().hex, int(time.time() * 1000)
            headers = raw_headers("pg", delivery_id, now_ms)
            if topic == CORRELATION:
                topic, headers = names(s.namespace).raw, correlation_headers("pg", delivery_id, now_ms)
            await producer.send_and_wait(topic, f"pg:{dep}".encode(), body, headers)
            ids.add(delivery_id)
    finally:
        await producer.stop()
    return ids


async def decided(s: Settings, ids: set[str], pipeline: Pipeline, limit_s: float = 120) -> list[dict[str, Any]]:
    """The latest decision of each delivery in ``ids``, once all of them are decided."""
    deadline = time.monotonic() + limit_s
    while True:
        latest: dict[str, dict[str, Any]] = {}
        for record in await read_topic(s.kafka_bootstrap, names(s.namespace).decisions):
            d = orjson.loads(record.value)
            if d["delivery_id"] in ids:
                latest[d["delivery_id"]] = d
        if len(latest) == len(ids):
            return list(latest.values())
        pipeline.restart_stalled()
        pipeline.assert_alive()
        assert time.monotonic() < deadline, f"{len(latest)} of {len(ids)} decided\n" + pipeline.log("worker")[-3000:]
        await asyncio.sleep(0.5)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("store", ["rocksdb", "memory"])
async def test_state_survives_restart_and_a_rebuild_from_the_changelog_alone(
        store: str, guarantee: str, kafka: KafkaBroker, postgres: PostgresServer, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"state{uuid.uuid4().hex[:8]}", data_dir=tmp_path / "data",
                      worker_stall_s=10.0, sweep_after_s=2.0, store=store, processing_guarantee=guarantee)
    await prepare(s)
    n = names(s.namespace)
    deps = [f"dep_r{i}" for i in range(DEPOSITS)]
    credited = deps[: DEPOSITS // 2]  # settled before the restart; the others stop at slip_received
    first = [(CORRELATION, d, orjson.dumps({"pg_deposit_id": d, "merchant_reference": f"mr_{d}",
                                            "our_order_id": f"o_{d}", "our_user_id": f"u_{d}"})) for d in deps]
    first += [(n.raw, d, deposit(d, v, st, sequence=i * 10 + v)) for i, d in enumerate(deps)
              for v, st in enumerate(["pending", "slip_received"], start=1)]
    first += [(n.raw, d, deposit(d, 3, "settled", sequence=i * 10 + 3)) for i, d in enumerate(credited)]
    first_ids = await deliver(s, first)

    pipeline = Pipeline(s, tmp_path)
    # the projector and the sweeper (in the fetcher) run throughout, as in production: Faust has
    # been seen to skip a record after a restart, and the sweeper is what appends it again
    pipeline.start("projector")
    pipeline.start("fetcher")
    pipeline.start("worker")
    try:
        found = await decided(s, first_ids, pipeline)
        # a deposit event read before its correlation (two topics) is parked, then unparked
        assert {d["outcome"] for d in found} <= {"applied", "unparked"}
        pipeline.terminate("worker")  # graceful: RocksDB keeps the state (memory: the changelog)
        rocks = list((tmp_path / "data").rglob("*.sst")) + list((tmp_path / "data").rglob("*.log"))
        assert rocks or s.store == "memory", "no RocksDB files in the worker data folder"
        if s.store == "rocksdb":  # each partition's store knows the last changelog record it holds
            last: dict[int, int] = {}
            for record in await read_topic(s.kafka_bootstrap, changelog_topic(s.namespace)):
                last[record.partition] = max(last.get(record.partition, -1), record.offset)
            assert persisted_offsets(tmp_path / "data") == last

        # restart from local state: every settled event again (a duplicate) and a reversal of every deposit
        second = [(n.raw, d, deposit(d, 3, "settled", sequence=deps.index(d) * 10 + 3)) for d in credited]
        second += [(n.raw, d, deposit(d, 4, "reversed", sequence=i * 10 + 4)) for i, d in enumerate(deps)]
        second_ids = await deliver(s, second)
        pipeline.start("worker")
        found = await decided(s, second_ids, pipeline)
        by_type = Counter((d["event_type"], d["outcome"]) for d in found)
        assert by_type == {("deposit.settled", "duplicate"): len(credited), ("deposit.reversed", "applied"): len(deps)}
        debits = {(e.key or b"").decode() for e in await read_topic(s.kafka_bootstrap, n.effects)
                  if orjson.loads(e.value)["type"] == "debit_user"}
        assert debits == {f"deposit:{d}:debit_user" for d in credited}, "a debit without a credit, or one missing"

        # kill -9 and lose the local folder: the state comes back from the changelog alone
        pipeline.kill("worker")
        shutil.rmtree(tmp_path / "data")
        third = [(n.raw, d, deposit(d, 4, "reversed", sequence=i * 10 + 4)) for i, d in enumerate(deps)]
        third_ids = await deliver(s, third)
        pipeline.start("worker")
        found = await decided(s, third_ids, pipeline)
        assert Counter(d["outcome"] for d in found) == {"duplicate": len(third)}
    finally:
        pipeline.stop()


async def test_exactly_once_commits_the_batched_changelog_in_the_partition_transactions(
        kafka: KafkaBroker, postgres: PostgresServer, tmp_path: Path) -> None:
    """With exactly-once the worker writes the table's changelog through Faust's transactional
    producers, when each partition's transaction commits. A restore reads the changelog
    read_committed, so state whose transaction was never committed would be missing: after a
    graceful stop every redelivery must still be a duplicate, both when the worker reads on from
    its local RocksDB (whose changelog offsets must be the last committed ones) and when the local
    folder is deleted."""
    s = make_settings(kafka.bootstrap, postgres.dsn, f"eos{uuid.uuid4().hex[:8]}", data_dir=tmp_path / "data",
                      worker_stall_s=10.0, sweep_after_s=2.0, processing_guarantee="exactly_once")
    await prepare(s)
    n = names(s.namespace)
    deps = [f"dep_x{i}" for i in range(40)]
    first = [(CORRELATION, d, orjson.dumps({"pg_deposit_id": d, "merchant_reference": f"mr_{d}",
                                            "our_order_id": f"o_{d}", "our_user_id": f"u_{d}"})) for d in deps]
    first += [(n.raw, d, deposit(d, 3, "settled", sequence=i + 1)) for i, d in enumerate(deps)]
    first_ids = await deliver(s, first)
    pipeline = Pipeline(s, tmp_path)
    pipeline.start("worker")
    try:
        found = await decided(s, first_ids, pipeline)
        assert {d["outcome"] for d in found} <= {"applied", "unparked"}
        pipeline.terminate("worker")  # graceful: Faust commits the open transactions
        committed = await read_topic(s.kafka_bootstrap, changelog_topic(s.namespace), isolation="read_committed")
        assert {r.key for r in committed} == {f"pg:{d}".encode() for d in deps}
        # each partition's store knows the last committed changelog record it holds (Faust's own
        # exactly-once path never persists it: a restart would restore the whole changelog)
        last: dict[int, int] = {}
        for record in committed:
            last[record.partition] = max(last.get(record.partition, -1), record.offset)
        assert persisted_offsets(tmp_path / "data") == last
        redelivered = [(n.raw, d, deposit(d, 3, "settled", sequence=i + 1)) for i, d in enumerate(deps)]
        for local_state in (True, False):  # a restart that reads on from RocksDB, then one from the changelog
            if not local_state:
                pipeline.terminate("worker")
                shutil.rmtree(tmp_path / "data")
            again = await deliver(s, redelivered)
            pipeline.start("worker")
            found = await decided(s, again, pipeline)
            assert Counter(d["outcome"] for d in found) == {"duplicate": len(deps)}, local_state
    finally:
        pipeline.stop()
