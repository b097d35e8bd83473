"""Latency from the ingest to the read model at a fixed load (open loop: a request every 1/RATE s,
whatever the answers), exactly-once on and off.

Each delivery's latency is ``webhook_events.projected_at - received_at``: the ingest stamps
received_at when the request arrives, PostgreSQL stamps projected_at when the projector writes the
row (migration 0008). The first WARMUP_S seconds are sent but not counted. It is also split into
stages by the records' Kafka timestamps (each set by its producer as it sends): the request to its
append to orderly.raw, that append to the decision's send by the worker, and the decision's send to
its row in PostgreSQL (with exactly-once: the wait for the commit, the commit, the projector).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from app.kafka_client import client_options
from app.settings import Settings
from bench.e2e import pipeline, wait_projected, write_requests
from bench.stack import embedded, save_results
from topics.catalog import names
from topics.records import H_DELIVERY_ID

RATE = float(os.environ.get("BENCH_RATE", "500"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "20"))
WARMUP_S = 3.0


async def send_open_loop(url: str, requests: list[dict[str, Any]], rate: float) -> dict[int, int]:
    statuses: dict[int, int] = {}
    started = time.monotonic()

    async def one(http: aiohttp.ClientSession, request: dict[str, Any]) -> None:
        async with http.post(url + request["path"], data=request["body"].encode(),
                             headers=request["headers"]) as resp:
            await resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as http:
        tasks = []
        for i, request in enumerate(requests):
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(http, request)))
        await asyncio.gather(*tasks)
    return statuses


async def latencies(settings: Settings, since_s: float) -> dict[str, float]:
    conn = await asyncpg.connect(settings.postgres_dsn.reveal(), server_settings={"search_path": settings.namespace})
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS n, "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50, "
            "percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) AS p99, max(lag) AS max FROM ("
            " SELECT extract(epoch FROM projected_at - received_at) * 1000 AS lag FROM webhook_events"
            " WHERE event_type LIKE 'deposit.%' AND received_at >= to_timestamp($1)) x", since_s)
        assert row is not None
        return {"events": int(row["n"]), "p50_ms": float(row["p50"]), "p99_ms": float(row["p99"]),
                "max_ms": float(row["max"])}
    finally:
        await conn.close()


async def send_times(settings: Settings, topic: str, delivery_id: Callable[[Any], str | None]) -> dict[str, int]:
    """Each delivery's first record in ``topic`` (read uncommitted: its send, not its commit) →
    that record's Kafka timestamp, in unix milliseconds."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                                isolation_level="read_uncommitted", **client_options(settings))
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        found: dict[str, int] = {}
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            for records in (await consumer.getmany(timeout_ms=1000, max_records=5000)).values():
                for record in records:
                    key = delivery_id(record)
                    if key is not None:
                        found.setdefault(key, record.timestamp)
        return found
    finally:
        await consumer.stop()


async def stages(settings: Settings, since_s: float) -> dict[str, dict[str, float]]:
    """p50 and p99 of each stage of a delivery's latency, in ms."""
    conn = await asyncpg.connect(settings.postgres_dsn.reveal(), server_settings={"search_path": settings.namespace})
    try:
        rows = await conn.fetch(
            "SELECT delivery_id, extract(epoch FROM received_at) * 1000 AS received,"
            " extract(epoch FROM projected_at) * 1000 AS projected FROM webhook_events"
            " WHERE event_type LIKE 'deposit.%' AND received_at >= to_timestamp($1)", since_s)
    finally:
        await conn.close()
    n = names(settings.namespace)
    appended = await send_times(settings, n.raw, lambda r: dict(r.headers).get(H_DELIVERY_ID, b"").decode() or None)
    decided = await send_times(settings, n.decisions, lambda r: orjson.loads(r.value).get("delivery_id"))
    spans: dict[str, list[float]] = {"request → raw append": [], "raw append → decision sent": [],
                                     "decision sent → read model": []}
    for row in rows:
        delivery = row["delivery_id"]
        if delivery in appended and delivery in decided:
            received, projected = float(row["received"]), float(row["projected"])
            spans["request → raw append"].append(appended[delivery] - received)
            spans["raw append → decision sent"].append(decided[delivery] - appended[delivery])
            spans["decision sent → read model"].append(projected - decided[delivery])

    def at(values: list[float], q: float) -> float:
        values = sorted(values)
        return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")

    return {stage: {"p50_ms": at(values, 0.5), "p99_ms": at(values, 0.99)} for stage, values in spans.items()}


def main() -> None:
    total = int(RATE * SECONDS)
    deposits = total // 3 + 1
    results: dict[str, dict[str, Any]] = {}
    with embedded("orderly-bench-latency-") as (work, kafka, postgres):
        for guarantee in ("at_least_once", "exactly_once"):
            with pipeline(kafka, postgres, guarantee, work, "latency", deposits) as (settings, url, _):
                requests_file = work / f"requests-latency-{guarantee}.json"
                write_requests(settings, requests_file, deposits)
                requests = orjson.loads(requests_file.read_bytes())[:total]
                since = time.time() + WARMUP_S
                statuses = asyncio.run(send_open_loop(url, requests, RATE))
                acked = sum(n for status, n in statuses.items() if 200 <= status < 300)
                asyncio.run(wait_projected(settings, acked, limit_s=120))
                results[guarantee] = {**asyncio.run(latencies(settings, since)), "acked": acked,
                                      "stages": asyncio.run(stages(settings, since))}
            print(f"{guarantee}: {results[guarantee]}", flush=True)
    print(f"\nlatency benchmark: ingest -> read model at {RATE:.0f} webhooks/s for {SECONDS:.0f} s "
          f"(first {WARMUP_S:.0f} s not counted), {os.cpu_count()} cores")
    print(f"{'mode':<16}{'events':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for mode, r in results.items():
        print(f"{mode:<16}{r['events']:>8.0f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{r['max_ms']:>9.1f}")
    print("target: p99 < 250 ms at 500 events/s")
    print(f"\nby stage, from the records' Kafka timestamps (p50 / p99 ms)\n{'stage':<30}"
          + "".join(f"{mode:>18}" for mode in results))
    for stage in next(iter(results.values()))["stages"]:
        print(f"{stage:<30}" + "".join(f"{r['stages'][stage]['p50_ms']:>9.1f} /{r['stages'][stage]['p99_ms']:>6.1f} "
                                       for r in results.values()))
    save_results("latency", results)


if __name__ == "__main__":
    main()
