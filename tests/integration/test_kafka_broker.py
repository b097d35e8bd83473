"""The started Apache Kafka broker: acks=all produce, consume, and a transactional round trip."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from app.stack.kafka import KafkaBroker
from app.stack.process import PortTakenError
from topics.admin import TopicMismatchError, ensure_topics, topic_configs
from topics.catalog import catalog, names


async def _read_all(bootstrap: str, topic: str, isolation: str, expect: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                isolation_level=isolation, enable_auto_commit=False)
    await consumer.start()
    seen: list[bytes] = []
    try:
        async with asyncio.timeout(20):
            while len(seen) < expect:
                batch = await consumer.getmany(timeout_ms=500)
                seen += [m.value for msgs in batch.values() for m in msgs]
        # one more poll: nothing beyond what we expect may be visible
        batch = await consumer.getmany(timeout_ms=500)
        seen += [m.value for msgs in batch.values() for m in msgs]
    finally:
        await consumer.stop()
    return seen


async def test_topics_are_created_once_with_their_settings(kafka: KafkaBroker, namespace: str) -> None:
    specs = catalog(namespace, partitions=4)
    created = await ensure_topics(kafka.bootstrap, specs)
    assert sorted(created) == sorted(s.name for s in specs)
    assert await ensure_topics(kafka.bootstrap, specs) == []

    n = names(namespace)
    configs = await topic_configs(kafka.bootstrap, [n.raw, n.state])
    assert configs[n.raw]["retention.ms"] == "-1"
    assert configs[n.raw]["retention.bytes"] == "-1"
    assert configs[n.state]["cleanup.policy"] == "compact"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([n.raw, n.state])
        assert sorted(len(d["partitions"]) for d in described) == [4, 4]
    finally:
        await admin.close()


async def test_a_partition_count_mismatch_is_refused(kafka: KafkaBroker, namespace: str) -> None:
    await ensure_topics(kafka.bootstrap, catalog(namespace, partitions=2))
    try:
        await ensure_topics(kafka.bootstrap, catalog(namespace, partitions=3))
    except TopicMismatchError as exc:
        assert f"{namespace}.raw" in str(exc)
    else:
        raise AssertionError("a raw topic with 2 partitions was accepted as 3")


async def test_acks_all_produce_then_consume(kafka: KafkaBroker, namespace: str) -> None:
    topic = names(namespace).raw
    await ensure_topics(kafka.bootstrap, catalog(namespace, partitions=3))
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        sent = [f"body-{i}".encode() for i in range(50)]
        await asyncio.gather(*(producer.send_and_wait(topic, v, key=b"pg:dep_1") for v in sent))
    finally:
        await producer.stop()
    # One key, one partition: the log keeps the order of acknowledged appends.
    got = await _read_all(kafka.bootstrap, topic, "read_uncommitted", 50)
    assert sorted(got) == sorted(sent)


async def test_transactions_commit_and_abort(kafka: KafkaBroker, namespace: str) -> None:
    topic = names(namespace).effects
    await ensure_topics(kafka.bootstrap, catalog(namespace, partitions=1))
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=f"{namespace}-tx")
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send(topic, b"committed-1")
            await producer.send(topic, b"committed-2")
        await producer.begin_transaction()
        await producer.send(topic, b"aborted")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, b"committed-3")
    finally:
        await producer.stop()
    committed = await _read_all(kafka.bootstrap, topic, "read_committed", 3)
    assert committed == [b"committed-1", b"committed-2", b"committed-3"]
    everything = await _read_all(kafka.bootstrap, topic, "read_uncommitted", 4)
    assert b"aborted" in everything


async def test_a_restart_moves_a_controller_port_taken_meanwhile(tmp_path: Path) -> None:
    """`orderly dev` once would not restart: an outgoing connection had taken the controller port
    kept in the data dir. The controller's port is the node's own affair; the broker's is not."""
    first = KafkaBroker(tmp_path / "kafka")  # our own broker: this test restarts it
    again: KafkaBroker | None = None
    try:
        first.start()
        await ensure_topics(first.bootstrap, catalog("moved", partitions=1))
        topic = names("moved").raw
        await _produce(first.bootstrap, topic, b"before")
        first.stop()
        with socket.socket() as squatter:  # someone else binds the kept controller port meanwhile
            squatter.bind(("127.0.0.1", first.controller_port))
            squatter.listen()
            again = KafkaBroker(tmp_path / "kafka")  # as after a restart: the ports from the data dir
            assert (again.port, again.controller_port) == (first.port, first.controller_port)
            await asyncio.to_thread(again.start)
        assert again.port == first.port  # clients' address unchanged
        assert again.controller_port != first.controller_port
        kept = json.loads((tmp_path / "kafka" / "ports.json").read_text())
        assert kept == {"broker": first.port, "controller": again.controller_port}
        assert f"CONTROLLER://127.0.0.1:{again.controller_port}" in (
            tmp_path / "kafka" / "server.properties").read_text()
        # the existing log, on the new controller port: it takes writes and serves what it had
        await _produce(again.bootstrap, topic, b"after")
        assert await _read_all(again.bootstrap, topic, "read_uncommitted", 2) == [b"before", b"after"]
    finally:
        first.stop()
        if again is not None:
            again.stop()


def test_a_taken_broker_port_stops_the_start_with_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        broker = KafkaBroker(tmp_path / "kafka", port=port)
        with pytest.raises(PortTakenError, match=rf"broker port {port} .* ORDERLY_KAFKA=127.0.0.1:<port>"):
            broker.start()
    assert broker.proc is None


async def _produce(bootstrap: str, topic: str, value: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=b"k")
    finally:
        await producer.stop()
