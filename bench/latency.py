"""Latency from the ingest to the read model at a fixed load (open loop: a request every 1/RATE s,
whatever the answers), exactly-once on and off.

Each delivery's latency is ``webhook_events.projected_at - received_at``: the ingest stamps
received_at when the request arrives, PostgreSQL stamps projected_at when the projector writes the
row (migration 0008). The first WARMUP_S seconds are sent but not counted.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiohttp
import asyncpg
import orjson

from app.settings import Settings
from bench.e2e import pipeline, wait_projected, write_requests
from bench.stack import embedded, save_results

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
    conn = await asyncpg.connect(settings.postgres_dsn, server_settings={"search_path": settings.namespace})
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


def main() -> None:
    total = int(RATE * SECONDS)
    deposits = total // 3 + 1
    results: dict[str, dict[str, float]] = {}
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
                results[guarantee] = {**asyncio.run(latencies(settings, since)), "acked": acked}
            print(f"{guarantee}: {results[guarantee]}", flush=True)
    print(f"\nlatency benchmark: ingest -> read model at {RATE:.0f} webhooks/s for {SECONDS:.0f} s "
          f"(first {WARMUP_S:.0f} s not counted), {os.cpu_count()} cores")
    print(f"{'mode':<16}{'events':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for mode, r in results.items():
        print(f"{mode:<16}{r['events']:>8.0f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{r['max_ms']:>9.1f}")
    print("target: p99 < 250 ms at 500 events/s")
    save_results("latency", results)


if __name__ == "__main__":
    main()
