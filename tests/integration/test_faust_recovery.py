"""Faust table recovery on the started broker: a table survives kill -9 of its worker.

Orderly's per-resource state lives in Faust tables; if recovery from the changelog were wrong on
this broker, every restart would forget versions and re-apply stale events.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from app.stack.kafka import KafkaBroker
from app.stack.process import spare_port

APP = Path(__file__).parent / "apps" / "counter_app.py"
KEYS = [b"k0", b"k1", b"k2", b"k3"]


def _start_worker(app_id: str, kafka: KafkaBroker, source: str, output: str, datadir: Path,
                  log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(APP), app_id, kafka.bootstrap, source, output, str(datadir),
             str(spare_port())],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )


async def _counts_reported(consumer: AIOKafkaConsumer, target: int, worker: subprocess.Popen[bytes],
                          log: Path) -> dict[str, list[int]]:
    """Every count reported per key, read until each key has reported ``target``."""
    seen: dict[str, list[int]] = {k.decode(): [] for k in KEYS}
    try:
        async with asyncio.timeout(120):
            while any(target not in counts for counts in seen.values()):
                assert worker.poll() is None, log.read_text(errors="replace")[-4000:]
                batch = await consumer.getmany(timeout_ms=500)
                for msgs in batch.values():
                    for m in msgs:
                        key, count = m.value.decode().split("=")
                        seen[key].append(int(count))
    except TimeoutError:
        raise AssertionError(f"reports so far {seen}\n{log.read_text(errors='replace')[-4000:]}") from None
    return seen


async def test_table_is_rebuilt_from_its_changelog_after_kill_9(kafka: KafkaBroker, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    app_id, source, output = f"counter-{suffix}", f"src-{suffix}", f"out-{suffix}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(source, 2, 1), NewTopic(output, 1, 1)])
    await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    consumer = AIOKafkaConsumer(output, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest",
                                isolation_level="read_committed")
    await producer.start()
    await consumer.start()
    log = tmp_path / "worker.log"
    worker = _start_worker(app_id, kafka, source, output, tmp_path / "data", log)
    try:
        for i in range(10):
            for key in KEYS:
                await producer.send(source, b"report" if i == 9 else b"tick", key=key)
        await producer.flush()
        first = await _counts_reported(consumer, 10, worker, log)
        assert all(counts == [10] for counts in first.values()), first

        worker.kill()  # kill -9: no clean shutdown, no final commit
        worker.wait()
        worker = _start_worker(app_id, kafka, source, output, tmp_path / "data2", log)
        for key in KEYS:
            await producer.send(source, b"report", key=key)
        await producer.flush()
        second = await _counts_reported(consumer, 11, worker, log)
        # The table resumes exactly where its committed changelog and offsets left it: no key
        # lost a count (a report below 10 after the restart) or counted one twice (above 11).
        # Faust may publish a report again after kill -9 (its exactly-once does not cover sends
        # to topics outside the source's partition group), which is why sinks dedupe anyway.
        assert all(set(counts) <= {10, 11} and counts[-1] == 11 for counts in second.values()), second
    finally:
        worker.kill()
        worker.wait()
        await producer.stop()
        await consumer.stop()
