"""A closed-loop HTTP load generator run in its own process: C clients POST pre-signed requests
for D seconds; prints JSON with the rate and latency percentiles."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def run(url: str, requests: list[dict[str, Any]], concurrency: int, duration: float,
              warmup: float, max_requests: int = 0) -> dict[str, float]:
    """Closed loop for ``duration`` after ``warmup``; with ``max_requests`` it stops once that many
    were sent (each request once), and the rate is taken over the time that actually took."""
    prepared = [(r["path"], r["body"].encode(), r["headers"]) for r in requests]
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    counter = 0
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + duration

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal counter
        while True:
            now = time.perf_counter()
            if now >= stop_at or (max_requests and counter >= max_requests):
                return
            path, body, headers = prepared[counter % len(prepared)]
            counter += 1
            async with session.post(url + path, data=body, headers=headers) as resp:
                await resp.read()
                done = time.perf_counter()
                if now >= measure_from:
                    latencies.append(done - now)
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    elapsed = min(time.perf_counter(), stop_at) - measure_from
    latencies.sort()
    return {
        "requests": len(latencies),
        "rate": len(latencies) / max(elapsed, 1e-3),
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "non_2xx": sum(n for s, n in statuses.items() if not 200 <= s < 300),
    }


if __name__ == "__main__":
    url, requests_file, concurrency, duration, warmup = sys.argv[1:6]
    max_requests = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    requests = orjson.loads(Path(requests_file).read_bytes())
    result = asyncio.run(run(url, requests, int(concurrency), float(duration), float(warmup), max_requests))
    print(orjson.dumps(result).decode())
