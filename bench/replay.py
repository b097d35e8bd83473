"""Replay rate: the in-process rebuild of `orderly replay` (app/replay.py: rebuild) against the live
worker's apply rate, side by side on the same log in one run.

The live rate is bench/worker.py's (one worker, a pre-filled orderly.raw, steady state: the 5th to
95th percentile of its decisions' timestamps, so its start-up and tail do not count). The rebuild
decides the merged log of that namespace again into a fresh namespace, with every output, the state
snapshots, the table changelog and the worker offsets written and acknowledged by Kafka. It is
reported twice: in steady state, the same measure on its decisions, like for like; and whole, from
the call to the last acknowledgement and the committed offsets (forks, producer start-up and the
wait for the last acks included), which is what an engineer waits for. Reading the log and copying
it into NS.raw are timed apart."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from app.process_setup import tune_gc
from app.replay import copy_log, merged_log, prepare_target, rebuild
from app.settings import dev_settings
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from bench.stack import embedded, save_results
from bench.worker import DEPOSITS, PARTITIONS, measure, run_mode

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))


def one_round(work: Path, kafka: KafkaBroker, postgres: PostgresServer) -> dict[str, float]:
    live = run_mode(kafka, postgres, "at_least_once", work)
    env = {"ORDERLY_KAFKA": kafka.bootstrap, "ORDERLY_POSTGRES_DSN": postgres.dsn,
           "ORDERLY_PARTITIONS": PARTITIONS, "ORDERLY_DATA_DIR": str(work)}
    source = dev_settings({**env, "ORDERLY_NAMESPACE": live["namespace"]})
    target = dev_settings({**env, "ORDERLY_NAMESPACE": f"{live['namespace']}_rb"})
    asyncio.run(prepare_target(target))
    tune_gc(target.gc_threshold)  # as `orderly replay` does
    # the broker finishes creating the new partitions' logs: topic creation (the changelog's too) is not timed
    time.sleep(3)
    started = time.monotonic()
    merged = asyncio.run(merged_log(source))
    read_s = time.monotonic() - started
    records = sum(len(v) for v in merged.values())
    started = time.monotonic()
    asyncio.run(copy_log(target, merged))
    copy_s = time.monotonic() - started
    started = time.monotonic()
    decided = rebuild(target, merged)
    rebuild_s = time.monotonic() - started
    # the live worker's measure, applied to the rebuild's decisions
    steady, _ = asyncio.run(measure(target, decided))
    return {"records": records, "decided": decided, "live_rate": live["rate"], "rebuild_rate": records / rebuild_s,
            "rebuild_steady_rate": steady, "read_rate": records / read_s, "copy_rate": records / copy_s}


def main() -> None:
    """Rounds of (live worker, rebuild of its log); each figure's best round is reported, as the
    other benchmarks do on this shared machine."""
    with embedded("orderly-bench-replay-") as (work, kafka, postgres):
        rounds = []
        for _ in range(ROUNDS):
            r = one_round(work, kafka, postgres)
            print(f"live {r['live_rate']:.0f}/s, rebuild {r['rebuild_rate']:.0f}/s whole, "
                  f"{r['rebuild_steady_rate']:.0f}/s steady", flush=True)
            rounds.append(r)
    best = {k: max(r[k] for r in rounds) for k in rounds[0]}
    live, whole, steady = best["live_rate"], best["rebuild_rate"], best["rebuild_steady_rate"]
    print(f"\nreplay benchmark: {DEPOSITS} deposits, {best['records']:.0f} records, {os.cpu_count()} cores, "
          f"{PARTITIONS} partitions, best of {ROUNDS} rounds")
    print(f"{'':<58}{'per s':>9}{'x live':>8}")
    print(f"{'live worker, steady state (5th-95th percentile of decisions)':<58}{live:>9.0f}{1:>8.1f}")
    print(f"{'rebuild, steady state (the same measure on its decisions)':<58}{steady:>9.0f}{steady / live:>8.1f}")
    print(f"{'rebuild, whole (fork, producers, last acks, offsets)':<58}{whole:>9.0f}{whole / live:>8.1f}")
    print(f"reading the log {best['read_rate']:.0f} records/s; "
          f"copying it into NS.raw {best['copy_rate']:.0f} records/s")
    print("target: replay >= 20,000 events/s and >= 4x the live apply rate")
    save_results("replay", {"rounds": rounds, "best": best})


if __name__ == "__main__":
    main()
