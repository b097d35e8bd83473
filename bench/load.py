"""A closed-loop HTTP load generator run in its own process: C clients POST pre-signed requests
for D seconds; prints JSON with the rate and latency percentiles."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def encode(url: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """One HTTP/1.1 keep-alive POST, encoded once before the clock starts."""
    host = urlsplit(url).netloc
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n{head}\r\n").encode() + body


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    """Send one request on a kept-alive connection and read the whole answer; return its status."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
        elif name.lower() == b"transfer-encoding":
            raise RuntimeError("chunked answers are not expected from the servers measured here")
    if length:
        await reader.readexactly(length)
    return status


async def run(url: str, requests: list[dict[str, Any]], concurrency: int, duration: float,
              warmup: float, max_requests: int = 0) -> dict[str, float]:
    """Closed loop for ``duration`` after ``warmup``; with ``max_requests`` it stops once that many
    were sent (each request once), and the rate is taken over the time that actually took.

    A client is a bare asyncio connection writing pre-encoded requests: an aiohttp client costs
    several times the CPU per request, and on two cores the load generator's CPU is taken from the
    servers being measured."""
    prepared = [encode(url, r["path"], r["body"].encode(), r["headers"]) for r in requests]
    parts = urlsplit(url)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    counter = 0
    started_at = time.time()  # wall clock, for a caller that times something this load causes
    cpu_at_start = time.process_time()
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + duration

    async def client() -> None:
        nonlocal counter
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            while True:
                now = time.perf_counter()
                if now >= stop_at or (max_requests and counter >= max_requests):
                    return
                request = prepared[counter % len(prepared)]
                counter += 1
                status = await exchange(reader, writer, request)
                if now >= measure_from:
                    latencies.append(time.perf_counter() - now)
                    statuses[status] = statuses.get(status, 0) + 1
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = min(time.perf_counter(), stop_at) - measure_from
    latencies.sort()
    return {
        "requests": len(latencies),
        "rate": len(latencies) / max(elapsed, 1e-3),
        "answered_s": elapsed,  # from the first request (after the warm-up) to the last answer
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "non_2xx": sum(n for s, n in statuses.items() if not 200 <= s < 300),
        "started_at": started_at + warmup,
        "cpu_s": time.process_time() - cpu_at_start,  # the generator's own, while it sent (warm-up included)
    }


def spawn(url: str, requests_file: Path, concurrency: int, duration: float, warmup: float = 0.0,
          max_requests: int = 0) -> dict[str, float]:
    """Run the generator in its own process (its CPU is not the caller's) and return its figures.
    It is this tree's generator even where the caller's PYTHONPATH names another build (bench ab):
    the builds compared are the servers, not the load."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run(
        [sys.executable, "-m", "bench.load", url, str(requests_file), str(concurrency), str(duration), str(warmup),
         str(max_requests)], capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"the load generator failed:\n{result.stderr[-3000:]}")
    return dict(orjson.loads(result.stdout))


if __name__ == "__main__":
    url, requests_file, concurrency, duration, warmup = sys.argv[1:6]
    max_requests = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    requests = orjson.loads(Path(requests_file).read_bytes())
    import uvloop

    from app.process_setup import tune_gc
    from app.settings import dev_settings

    tune_gc(dev_settings().gc_threshold)  # the generator's CPU comes out of what the servers measured get

    result = uvloop.run(run(url, requests, int(concurrency), float(duration), float(warmup), max_requests))
    print(orjson.dumps(result).decode())
