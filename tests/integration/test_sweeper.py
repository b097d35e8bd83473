"""A stored record that never got a decision is appended again; a decided one never is."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import SimpleNamespace

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from app import sweeper as sweeper_module
from app.bootstrap import prepare
from app.producer import KeyedProducer
from app.settings import Settings
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.sweeper import Sweeper
from projections.migrate import quote_ident
from tests.pg_events import deposit
from tests.support import make_settings, read_topic
from topics.catalog import names
from topics.records import raw_headers


async def commit_worker_group(s: Settings, topic: str, at_start: bool = False) -> dict[int, int]:
    """What the worker does once it decided (or believes it decided) every record of ``topic``
    (``at_start``: none of them)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=s.kafka_bootstrap, group_id=f"{s.namespace}-worker",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(s.partitions)]
        consumer.assign(tps)
        ends = {tp: 0 for tp in tps} if at_start else await consumer.end_offsets(tps)
        await consumer.commit(ends)
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


@asynccontextmanager
async def sweeping(s: Settings, reappended: Callable[[str], object]) -> AsyncIterator[tuple[
        KeyedProducer, asyncpg.Pool, Sweeper]]:
    """The namespace's topics and tables, a producer, a pool and a Sweeper (started by the test)."""
    await prepare(s)
    producer = KeyedProducer(s.kafka_bootstrap)
    await producer.start()
    pool = await asyncpg.create_pool(s.postgres_dsn.reveal(), min_size=1, max_size=2,
                                     server_settings={"search_path": quote_ident(s.namespace)})
    sweeper = Sweeper(s, pool, producer, reappended)
    try:
        yield producer, pool, sweeper
    finally:
        await sweeper.stop()
        await pool.close()
        await producer.stop()


async def test_undecided_records_are_appended_again_until_decided(kafka: KafkaBroker, postgres: PostgresServer,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The sweeper's clock for "not again within ORDERLY_SWEEP_AFTER_S" is moved by the test: a sweep
    # that took seconds on a busy machine would otherwise find its own copies due again.
    clock = [time.monotonic()]
    monkeypatch.setattr(sweeper_module, "time", SimpleNamespace(time=time.time, monotonic=lambda: clock[0]))
    s = make_settings(kafka.bootstrap, postgres.dsn, f"sweep{uuid.uuid4().hex[:8]}", sweep_after_s=2.0)
    n = names(s.namespace)
    reappended: list[str] = []
    async with sweeping(s, reappended.append) as (producer, pool, sweeper):
        await producer.send_all([(n.raw, f"pg:dep_w{i}".encode(), deposit(f"dep_w{i}", 1, "pending"),
                                  raw_headers("pg", f"d{i}", 1_700_000_000_000)) for i in range(3)])
        await pool.execute("INSERT INTO webhook_events (delivery_id, gateway, received_at, outcome) "
                           "VALUES ('d0', 'pg', now(), 'applied')")
        await sweeper.start()
        await commit_worker_group(s, n.raw, at_start=True)  # the group exists, but is not past the raw records
        assert await sweeper.sweep() == 0  # the worker group has not committed past them: not lost
        # a decision the projector has not stored yet: the missing rows may be in it
        await producer.send_all([(n.decisions, b"pg:dep_w9", b"{}")])
        partition = await producer.partition(n.decisions, b"pg:dep_w9")
        committed = await commit_worker_group(s, n.raw)
        assert await sweeper.sweep() == 0  # past the worker, but the projector is behind: not lost yet
        await pool.execute("INSERT INTO projector_offsets VALUES ('projector', $1, $2, 1)", n.decisions, partition)
        assert await sweeper.sweep() == 2  # d1 and d2: past the worker and the projector, and no row
        assert await sweeper.sweep() == 0  # not again within ORDERLY_SWEEP_AFTER_S
        copies = [r.headers["delivery_id"] for r in await read_topic(s.kafka_bootstrap, n.raw)]
        assert sorted(copies) == ["d0", "d1", "d1", "d2", "d2"]
        clock[0] += 2.1  # ORDERLY_SWEEP_AFTER_S (2 s) passes before a second sweep
        await pool.execute("INSERT INTO webhook_events (delivery_id, gateway, received_at, outcome) "
                           "VALUES ('d1', 'pg', now(), 'applied')")
        assert await sweeper.sweep() == 1  # d2 still has none
        await pool.execute("INSERT INTO webhook_events (delivery_id, gateway, received_at, outcome) "
                           "VALUES ('d2', 'pg', now(), 'applied')")
        clock[0] += 2.1  # the same: past ORDERLY_SWEEP_AFTER_S, d2 would be due again
        assert await sweeper.sweep() == 0
        ends = await pool.fetch("SELECT partition, next_offset FROM projector_offsets WHERE consumer = 'sweeper' "
                                "AND topic = $1", n.raw)
        # every original is decided: the sweep position is where the worker group is (the copies lie beyond)
        assert {r["partition"]: r["next_offset"] for r in ends} == committed
        assert reappended == [n.raw] * 3


async def test_a_record_whose_received_at_is_no_time_is_swept_as_an_old_one(kafka: KafkaBroker,
                                                                            postgres: PostgresServer) -> None:
    """A record appended some other way than by the ingest may carry anything as its received_at: the
    worker sets it aside (a quarantine row), and the sweeper takes it as old, never raising (it did:
    the fetcher that runs it then restarted on the same record for ever). Its records are on the
    broker before the sweeper starts, so its first pass reads every partition from the beginning
    (with aiokafka's default reset, one partition in two began at its end)."""
    s = make_settings(kafka.bootstrap, postgres.dsn, f"sweepodd{uuid.uuid4().hex[:8]}", sweep_after_s=2.0)
    n = names(s.namespace)
    async with sweeping(s, lambda _topic: None) as (producer, pool, sweeper):
        odd = [b"abc", b"\xff", b"253402300800000", b"-5"]
        await producer.send_all([(n.raw, f"pg:dep_o{i}".encode(), deposit(f"dep_o{i}", 1, "pending"),
                                  [(k, value if k == "received_at" else v) for k, v in
                                   raw_headers("pg", f"o{i}", 1_700_000_000_000)]) for i, value in enumerate(odd)])
        await pool.execute("INSERT INTO quarantine (delivery_id, stage, reason, headers, body) "
                           "VALUES ('o0', 'worker', 'ValueError', '[]', '')")  # set aside by the worker
        await sweeper.start()
        await commit_worker_group(s, n.raw)
        assert await sweeper.sweep() == 3  # o1-o3: old, past the worker and the projector, and no row
        copies = sorted(r.headers["delivery_id"] for r in await read_topic(s.kafka_bootstrap, n.raw))
        assert copies == ["o0", "o1", "o1", "o2", "o2", "o3", "o3"]
