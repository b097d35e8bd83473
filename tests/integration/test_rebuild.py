"""The replay's rebuild split across forked processes writes what the in-process rebuild writes:
the same records per topic-partition (in the same order where a partition holds one input
partition's resources) and the same worker offsets."""

from __future__ import annotations

import asyncio
import random
import uuid

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

import app.replay
from app.replay import Merged, prepare_target, rebuild
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.worker.store import changelog_topic
from tests.pg_events import deposit
from tests.support import make_settings, read_topic
from topics.partitioning import partition_for
from topics.records import raw_headers


def merged_log(partitions: int, deposits: int, seed: int) -> Merged:
    """Correlations and deliveries (stale, duplicate, early ones among them) spread by key like the live log."""
    rng = random.Random(seed)
    merged: Merged = {p: [] for p in range(partitions)}
    for i in range(deposits):
        dep = f"dep_r{i}"
        key = f"pg:{dep}".encode()
        corr = orjson.dumps({"pg_deposit_id": dep, "merchant_reference": f"mr_{dep}", "our_order_id": f"o_{dep}",
                             "our_user_id": f"u_{dep}"})
        records = [(key, deposit(dep, v, s), raw_headers("pg", f"d{i}-{v}", 1_700_000_000_000 + v))
                   for v, s in enumerate(["pending", "slip_received", "settled", "reversed"], start=1)]
        records.append(records[rng.randrange(len(records))])  # a redelivery
        rng.shuffle(records)
        records.insert(rng.randrange(len(records) + 1),
                       (key, corr, [*raw_headers("pg", f"c{i}", 1_700_000_000_000, "merchant"),
                                    ("record", b"correlation")]))
        merged[partition_for(key, partitions)] += records
    return merged


async def topic_records(bootstrap: str, topic: str) -> dict[int, list[tuple[bytes, bytes]]]:
    found: dict[int, list[tuple[bytes, bytes]]] = {}
    for r in await read_topic(bootstrap, topic):
        found.setdefault(r.partition, []).append((r.key or b"", r.value))
    return found


async def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int | None]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return [await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        await consumer.stop()


def test_forked_rebuild_writes_what_the_in_process_rebuild_writes(
        kafka: KafkaBroker, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app.replay, "FORK_FROM", 0)  # this small log is split across processes too
    merged = merged_log(3, 60, seed=11)
    results = []
    for processes in (1, 2):
        s = make_settings(kafka.bootstrap, postgres.dsn, f"rb{processes}{uuid.uuid4().hex[:8]}")
        asyncio.run(prepare_target(s))
        decided = rebuild(s, merged, processes)
        written = {}
        for suffix in ("decisions", "effects", "facts", "state"):
            written[suffix] = asyncio.run(topic_records(kafka.bootstrap, f"{s.namespace}.{suffix}"))
        written["changelog"] = asyncio.run(topic_records(kafka.bootstrap, changelog_topic(s.namespace)))
        offsets = asyncio.run(committed(kafka.bootstrap, f"{s.namespace}-worker", f"{s.namespace}.raw", s.partitions))
        results.append((decided, written, offsets))
    (decided_1, written_1, offsets_1), (decided_2, written_2, offsets_2) = results
    assert decided_1 == decided_2 >= sum(len(records) for records in merged.values())
    assert offsets_1 == offsets_2 == [len(merged[p]) for p in range(3)]
    # keyed by the resource, like the input: the same records in the same order per partition
    for suffix in ("decisions", "changelog"):
        assert written_1[suffix] == written_2[suffix], suffix
    # keyed by the effect's dedupe key or the fact's own key, so a partition mixes resources of
    # every input partition, in whatever order the processes finished; snapshots come from a set
    for suffix in ("effects", "facts", "state"):
        assert {p: sorted(r) for p, r in written_1[suffix].items()} == \
            {p: sorted(r) for p, r in written_2[suffix].items()}, suffix
    effect_keys = [key for records in written_1["effects"].values() for key, _ in records]
    assert effect_keys and len(effect_keys) == len(set(effect_keys))  # each effect once, redeliveries or not
