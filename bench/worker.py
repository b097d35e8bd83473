"""Worker throughput: pg events/s decided by one `orderly worker` from a pre-filled orderly.raw,
with exactly-once on and off, measured side by side in one run.

The rate is taken from the decisions' own Kafka timestamps (5th to 95th percentile), so Faust's
start-up and rebalance time are not counted: it is the steady-state apply rate.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from app.bootstrap import prepare
from app.kafka_client import client_options
from app.producer import KeyedProducer
from app.settings import Settings, dev_settings
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.stack.process import stop_process
from bench.stack import cpu_seconds, embedded, save_results
from tests.pg_events import deposit
from topics.catalog import names
from topics.records import CHECKED, correlation_headers, raw_headers

DEPOSITS = int(os.environ.get("BENCH_DEPOSITS", "5000"))
PARTITIONS = os.environ.get("BENCH_PARTITIONS", "12")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
MODES = os.environ.get("BENCH_MODES", "at_least_once,exactly_once").split(",")


async def prefill(settings: Settings) -> int:
    """Correlations for every deposit, then 4 deliveries each (one a redelivery), interleaved."""
    n = names(settings.namespace)
    producer = KeyedProducer(settings.kafka_bootstrap, linger_ms=20, **client_options(settings))
    await producer.start()
    try:
        futures = []
        for i in range(DEPOSITS):
            dep = f"dep_b{i}"
            corr = {"pg_deposit_id": dep, "merchant_reference": f"mr_{dep}", "our_order_id": f"o_{dep}",
                    "our_user_id": f"u_{dep}"}
            futures.append(await producer.send(n.raw, f"pg:{dep}".encode(), orjson.dumps(corr),
                                               correlation_headers("pg", f"c{i}", 1_700_000_000_000)))
        count = 0
        for step, status in enumerate(["pending", "slip_received", "settled", "settled"]):
            for i in range(DEPOSITS):
                dep = f"dep_b{i}"
                version = min(step, 2) + 1
                body = deposit(dep, version, status, sequence=i * 3 + version)
                futures.append(await producer.send(n.raw, f"pg:{dep}".encode(), body,
                                                   [*raw_headers("pg", f"d{step}-{i}", 1_700_000_000_000),
                                                    CHECKED]))
                count += 1
        await asyncio.gather(*futures)
        return count
    finally:
        await producer.stop()


async def measure(settings: Settings, expected: int, limit_s: float = 600) -> tuple[float, int]:
    """Steady-state rate: decisions between the 5th and the 95th percentile of their Kafka
    timestamps, so a rebalance at start-up or a slow tail does not count as apply time."""
    consumer = AIOKafkaConsumer(names(settings.namespace).decisions, bootstrap_servers=settings.kafka_bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False, **client_options(settings))
    await consumer.start()
    stamps: list[int] = []
    try:
        async with asyncio.timeout(limit_s):
            while len(stamps) < expected:
                batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
                stamps += [m.timestamp for messages in batch.values() for m in messages]
    finally:
        await consumer.stop()
    stamps.sort()
    low, high = len(stamps) * 5 // 100, len(stamps) * 95 // 100
    return (high - low) / max((stamps[high] - stamps[low]) / 1000, 1e-3), len(stamps)


def run_mode(kafka: KafkaBroker, postgres: PostgresServer, guarantee: str, work: Path) -> dict[str, Any]:
    namespace = f"bench_{guarantee}_{time.time_ns()}"
    env = {**os.environ, "ORDERLY_KAFKA": kafka.bootstrap, "ORDERLY_POSTGRES_DSN": postgres.dsn,
           "ORDERLY_NAMESPACE": namespace, "ORDERLY_PROCESSING_GUARANTEE": guarantee, "ORDERLY_DATA_DIR": str(work),
           "ORDERLY_PARTITIONS": PARTITIONS}
    settings = dev_settings(env)
    env.update(settings.to_env())
    asyncio.run(prepare(settings))
    events = asyncio.run(prefill(settings))
    expected = events + DEPOSITS  # one decision per delivery and per correlation
    started = time.monotonic()
    with (work / f"worker-{guarantee}.log").open("ab") as log:
        worker = subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
    cpu_before = cpu_seconds({"worker": worker}, kafka, postgres)
    try:
        rate, seen = asyncio.run(measure(settings, expected))
        cpu = cpu_seconds({"worker": worker}, kafka, postgres)
    finally:
        stop_process(worker, 30)
    return {"namespace": namespace, "decisions": seen, "rate": rate, "wall_s": time.monotonic() - started,
            "worker_cpu_s": round(cpu["worker"] - cpu_before["worker"], 1),
            "kafka_cpu_s": round(cpu["kafka"] - cpu_before["kafka"], 1)}


def main() -> None:
    """Modes alternate for ROUNDS rounds (this machine is shared and noisy); each mode's best round
    is reported, and the ratio is taken between the best rounds."""
    results: dict[str, dict[str, Any]] = {}
    with embedded("orderly-bench-worker-") as (work, kafka, postgres):
        for _ in range(ROUNDS):
            for guarantee in MODES:
                result = run_mode(kafka, postgres, guarantee, work)
                print(f"{guarantee}: {result['rate']:.0f} decisions/s", flush=True)
                if guarantee not in results or result["rate"] > results[guarantee]["rate"]:
                    results[guarantee] = result
    ratio = results["exactly_once"]["rate"] / results["at_least_once"]["rate"] if len(results) == 2 else 0.0
    print(f"\nworker benchmark: {DEPOSITS} deposits, {DEPOSITS * 5} records (4 deliveries + 1 correlation each), "
          f"{os.cpu_count()} cores, one worker, {PARTITIONS} partitions")
    print(f"{'mode':<16}{'decisions/s':>14}{'wall s (incl. start-up)':>26}{'worker CPU s':>14}{'Kafka CPU s':>13}")
    for mode, r in results.items():
        print(f"{mode:<16}{r['rate']:>14.0f}{r['wall_s']:>26.1f}{r['worker_cpu_s']:>14.1f}{r['kafka_cpu_s']:>13.1f}")
    print(f"exactly-once / at-least-once: {ratio:.2f} (target >= 0.70); target >= 5000 decisions/s")
    save_results("worker", {"deposits": DEPOSITS, "results": results, "ratio": ratio})


if __name__ == "__main__":
    main()
