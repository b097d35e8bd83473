"""Ingest throughput: signed webhooks/s and p50/p99 latency with acks=all, side by side with a
bare aiohttp handler (the ceiling on this machine), in one run on loopback."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

from app.bootstrap import prepare
from app.settings import dev_settings
from app.stack.process import port_accepts, spare_port, stop_process, wait_until
from bench.load import spawn
from bench.stack import embedded, process_cpu, save_results
from tests.support import signed_headers

CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "64"))
DURATION = float(os.environ.get("BENCH_SECONDS", "10"))
WARMUP = 2.0
ROUNDS = 2


def _requests(settings_env: dict[str, str], path: Path, count: int = 3000) -> None:
    settings = dev_settings(settings_env)
    out = []
    for i in range(count):
        gateway = ("pg", "card", "paymos")[i % 3]
        if gateway == "pg":
            body = {"id": f"evt_{i}", "object": "event", "type": "deposit.updated", "sequence": i,
                    "created": "2026-11-29T10:00:00Z",
                    "data": {"object": {"id": f"dep_{i % 500}", "object": "deposit", "version": i,
                                        "status": "pending", "ordered_amount_minor": 500000}}}
        elif gateway == "card":
            body = {"id": f"evt_c{i}", "type": "payment.captured", "payment_ref": f"pay_{i % 500}",
                    "sequence": i, "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": 8000,
                    "currency": "EUR"}
        else:
            body = {"event_id": f"evt_p{i}", "event_type": "invoice.confirming", "created_at": 1,
                    "data": {"id": f"inv_{i % 500}", "object": "invoice", "status": "confirming",
                             "is_final": False, "updated_at": i, "amount": "0.125"}}
        raw = orjson.dumps(body)
        out.append({"path": f"/webhooks/{gateway}", "body": raw.decode(),
                    "headers": signed_headers(gateway, raw, settings)})
    path.write_bytes(orjson.dumps(out))


def _load(url: str, requests_file: Path) -> dict[str, float]:
    return spawn(url, requests_file, CONCURRENCY, DURATION, WARMUP)


def _serve(argv: list[str], env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_until(lambda: port_accepts(port), 60, " ".join(argv), lambda: proc.poll() is None)
    return proc


def _answered(run: dict[str, float]) -> float:
    """Requests answered while the CPU was counted: the warm-up's too, at the run's own rate."""
    return max(run["requests"] * (DURATION + WARMUP) / DURATION, 1.0)


def main() -> None:
    results: dict[str, list[dict[str, float]]] = {"bare": [], "ingest": []}
    with embedded("orderly-bench-", heap_mb=384) as (work, kafka, postgres):
        bootstrap = kafka.bootstrap
        ingest_port, bare_port = spare_port(), spare_port()
        env = {**os.environ, "ORDERLY_KAFKA": kafka.bootstrap, "ORDERLY_POSTGRES_DSN": postgres.dsn,
               "ORDERLY_INGEST_PORT": str(ingest_port), "ORDERLY_NAMESPACE": "bench"}
        settings = dev_settings(env)
        env.update(settings.to_env())  # `orderly ingest` is a production process: give it everything
        asyncio.run(prepare(settings))
        requests_file = work / "requests.json"
        _requests(env, requests_file)
        ingest = _serve([sys.executable, "-m", "app.cli", "ingest"], env, ingest_port, work / "ingest.log")
        bare = _serve([sys.executable, "-m", "bench.bare_server", str(bare_port)], env, bare_port,
                      work / "bare.log")
        try:
            for _ in range(ROUNDS):  # alternate, so both see the same machine noise
                before_bare = process_cpu(bare.pid)
                run = _load(f"http://127.0.0.1:{bare_port}", requests_file)
                run["server_cpu_s"] = process_cpu(bare.pid) - before_bare
                results["bare"].append(run)
                before = process_cpu(kafka.pid or 0), process_cpu(ingest.pid)
                run = _load(f"http://127.0.0.1:{ingest_port}", requests_file)
                run["kafka_cpu_s"] = process_cpu(kafka.pid or 0) - before[0]
                run["ingest_cpu_s"] = process_cpu(ingest.pid) - before[1]
                results["ingest"].append(run)
        finally:
            stop_process(ingest, 15)
            stop_process(bare, 15)
    best = {name: max(runs, key=lambda r: r["rate"]) for name, runs in results.items()}
    ratio = best["ingest"]["rate"] / best["bare"]["rate"]
    print(f"\ningest benchmark: {CONCURRENCY} concurrent clients, {DURATION:.0f}s x {ROUNDS} rounds, "
          f"loopback, {os.cpu_count()} cores, Kafka {bootstrap} acks=all idempotent")
    print(f"{'server':<28}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'non-2xx':>10}")
    for name, label in (("bare", "bare aiohttp (ceiling)"), ("ingest", "orderly ingest, acks=all")):
        r = best[name]
        print(f"{label:<28}{r['rate']:>10.0f}{r['p50_ms']:>10.1f}{r['p99_ms']:>10.1f}{r['non_2xx']:>10.0f}")
    print(f"ratio ingest/bare: {ratio:.2f} (target >= 0.50)")
    r = best["ingest"]
    print(f"CPU during the ingest run ({DURATION + WARMUP:.0f}s): ingest process {r['ingest_cpu_s']:.1f}s, "
          f"Kafka broker {r['kafka_cpu_s']:.1f}s")
    for name, cpu, label in (("bare", "server_cpu_s", "bare aiohttp"), ("ingest", "ingest_cpu_s", "orderly ingest"),
                             ("ingest", "kafka_cpu_s", "Kafka broker, the ingest's appends")):
        print(f"CPU-s per 1,000 requests, {label}, every run: "
              + ", ".join(f"{1000 * run[cpu] / _answered(run):.3f}" for run in results[name]))
    save_results("ingest", {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "concurrency": CONCURRENCY,
                            "duration_s": DURATION, "runs": results, "ratio": ratio})


if __name__ == "__main__":
    main()
