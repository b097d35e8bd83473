"""What an idle stack costs: CPU milliseconds per second of every process (ingest, worker, projector,
effects, Kafka, PostgreSQL) with nothing arriving, per guarantee. At a few hundred webhooks a
second this is as much as the work itself, so it is CPU per webhook too.

``python -m bench idle`` measures this tree; ``python -m bench idle '{"old": {"PYTHONPATH": "/tmp/old"},
"new": {}}'`` compares builds (or settings) side by side, the order turned each round, on one broker.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

import orjson

from bench import e2e
from bench.ab import environment
from bench.stack import embedded, save_results

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "20"))
SETTLE_S = 5.0  # after the pipeline's own join and recovery (e2e.pipeline): the first fetches and commits


def measure(kafka: Any, postgres: Any, guarantee: str, work: Any, tag: str) -> dict[str, float]:
    """CPU-ms per second of each process of a fresh idle pipeline over SECONDS."""
    with e2e.pipeline(kafka, postgres, guarantee, work, tag, deposits=100) as (_, _, procs):
        time.sleep(SETTLE_S)
        before = e2e.cpu_by_process(procs, kafka, postgres)
        time.sleep(SECONDS)
        after = e2e.cpu_by_process(procs, kafka, postgres)
    return {name: round(1000 * (after[name] - before.get(name, 0.0)) / SECONDS, 1) for name in after}


def run(variants: dict[str, dict[str, str]]) -> dict[str, Any]:
    found: dict[str, dict[str, list[float]]] = {}
    with embedded("orderly-bench-idle-") as (work, kafka, postgres):
        for round_no in range(ROUNDS):
            for guarantee in e2e.MODES:
                for number, (name, env) in enumerate(e2e.turned(list(variants.items()), round_no)):
                    with environment(env):
                        cost = measure(kafka, postgres, guarantee, work, f"idle{round_no}{number}{name}")
                    total = round(sum(cost.values()), 1)
                    print(f"round {round_no + 1}, {guarantee}, {name}: {total} CPU-ms per second idle {cost}",
                          flush=True)
                    found.setdefault(f"{name} {guarantee}", {}).setdefault("total", []).append(total)
                    for process, ms in cost.items():
                        found[f"{name} {guarantee}"].setdefault(process, []).append(ms)
    medians = {key: {process: statistics.median(values) for process, values in by.items()}
               for key, by in found.items()}
    for key, by in medians.items():
        print(f"{key}: median {by['total']} CPU-ms per second idle "
              f"{ {k: v for k, v in by.items() if k != 'total'} }")
    return {"rounds": ROUNDS, "seconds": SECONDS, "median_ms_per_s": medians}


def main(argv: list[str] | None = None) -> None:
    variants = orjson.loads(argv[0]) if argv else {"now": {}}
    save_results("idle", run(variants))


if __name__ == "__main__":
    main(sys.argv[1:])
