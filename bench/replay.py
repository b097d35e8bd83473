"""Replay rate: the in-process rebuild of `orderly replay` (app/replay.py: rebuild) against the live
worker's apply rate, side by side on the same log in one run.

The live rate is bench/worker.py's (one worker, a pre-filled orderly.raw, steady state). The
rebuild rate is the merged log of that namespace decided again into a fresh namespace, with every
output, the state snapshots, the table changelog and the worker offsets written and acknowledged
by Kafka (reading the log and copying it into NS.raw are timed apart)."""

from __future__ import annotations

import asyncio
import os
import time

from app.cli import tune_gc
from app.replay import copy_log, merged_log, prepare_target, rebuild
from app.settings import dev_settings
from bench.stack import embedded, save_results
from bench.worker import DEPOSITS, PARTITIONS, run_mode


def main() -> None:
    with embedded("orderly-bench-replay-") as (work, kafka, postgres):
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
    rate = records / rebuild_s
    print(f"\nreplay benchmark: {DEPOSITS} deposits, {records} records, {os.cpu_count()} cores, "
          f"{PARTITIONS} partitions")
    print(f"live worker (at-least-once, steady state)   {live['rate']:>8.0f} records/s")
    print(f"replay rebuild (state + {decided} decisions)  {rate:>8.0f} records/s  ({rate / live['rate']:.1f}x live)")
    print(f"reading the log {records / read_s:.0f} records/s; copying it into NS.raw {records / copy_s:.0f} records/s")
    print("target: replay >= 20,000 events/s and >= 4x the live apply rate")
    save_results("replay", {"records": records, "live_rate": live["rate"], "rebuild_rate": rate,
                            "read_rate": records / read_s, "copy_rate": records / copy_s})


if __name__ == "__main__":
    main()
