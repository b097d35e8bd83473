"""The pure decision path alone: pre-built orderly.raw records of the three gateways decided in
batches by app/core/dispatch.py, in-process, with no Kafka, Faust or PostgreSQL.

The records are what the ingest appends for the simulator's lifecycles (`orderly simulate`): the
merchant's correlations first, then every webhook in creation order with the ingest's headers
(checked, as its adapter validated it), every fifth one delivered twice. The resources' states live
in a dict, written back after each batch as the worker writes its table. A round decides the whole
log on fresh state; the figure is records per second, best of the rounds.

The process tunes its garbage collector as the worker's does at start-up (app/cli.py ``tune_gc``:
``gc.freeze()`` of what start-up built, then ORDERLY_GC_THRESHOLD, 50,000 by default; set it to 0
for Python's defaults): the figure is what the worker's process does.
"""

from __future__ import annotations

import os
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import NamedTuple

from app.core.dispatch import Incoming, plan_batch
from app.gateways.registry import GATEWAYS
from app.process_setup import tune_gc
from app.settings import dev_settings
from app.simulator import card as card_simulator
from app.simulator import lifecycles
from app.simulator import paymos as paymos_simulator
from app.simulator import pg as pg_simulator
from bench.stack import save_results
from topics.catalog import names
from topics.partitioning import partition_for
from topics.records import CHECKED, Correlation, correlation_headers, raw_headers

RESOURCES = int(os.environ.get("BENCH_RESOURCES", "260"))  # per gateway and kind: about 5,000 records
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))
BATCH = int(os.environ.get("BENCH_BATCH", "1000"))  # the worker's default worker_batch_max
PARTITIONS = 12
RECEIVED_AT_MS = 1_796_000_000_000


class Raw(NamedTuple):
    """A record of orderly.raw as the worker consumes it."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    partition: int
    offset: int


def build(resources: int = RESOURCES, seed: int = 7) -> list[Raw]:
    """The log, in append order: correlations, then the webhooks (a fifth of them redelivered)."""
    rng, truth = random.Random(seed), lifecycles.Truth()
    emitted = [*pg_simulator.lifecycle(rng, resources, max(1, resources // 3), truth),
               *card_simulator.lifecycle(rng, resources, truth), *paymos_simulator.lifecycle(rng, resources, truth)]
    emitted.sort(key=lambda e: e.created_ms)
    appended: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = []
    for i, (dep, mapping) in enumerate(truth.correlations.items()):
        correlation = Correlation(dep, mapping["merchant_reference"], mapping["our_order_id"], mapping["our_user_id"])
        appended.append((f"pg:{dep}".encode(), correlation.to_bytes(),
                         correlation_headers("pg", f"c{i}", RECEIVED_AT_MS)))
    for i, e in enumerate(emitted):
        route = GATEWAYS[e.gateway].adapter.route(e.body)
        assert route.resource_key is not None, route.quarantine_reason
        for copy in range(2 if i % 5 == 0 else 1):
            headers = [*raw_headers(e.gateway, f"d{i}-{copy}", RECEIVED_AT_MS + i), CHECKED]
            appended.append((route.resource_key.encode(), e.body, headers))
    offsets: dict[int, int] = defaultdict(int)
    log = []
    for key, value, headers in appended:
        partition = partition_for(key, PARTITIONS)
        log.append(Raw(key, value, headers, partition, offsets[partition]))
        offsets[partition] += 1
    return log


def decide_all(log: list[Raw], batch: int = BATCH) -> dict[bytes, bytes]:
    """Decide the whole log a batch at a time on fresh state; the resources' final states."""
    n = names("bench")
    store: dict[bytes, bytes] = {}

    def read(partition: int, key: bytes) -> bytes | None:
        return store.get(key)

    for start in range(0, len(log), batch):
        incoming = [Incoming(r.key, r.value, r.headers, r.offset, r.partition, n.raw) for r in log[start:start + batch]]
        store.update(plan_batch(n, GATEWAYS, incoming, read).states)
    return store


def as_the_worker() -> None:
    """The garbage collector as the worker's process tunes it after start-up."""
    tune_gc(dev_settings(os.environ).gc_threshold)


def timed(run: Callable[[], object], rounds: int) -> list[float]:
    """Seconds per round, after one round to warm up."""
    run()
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    as_the_worker()
    log = build()
    seconds = timed(lambda: decide_all(log), ROUNDS)
    rates = [len(log) / s for s in seconds]
    print(f"decide: {len(log)} records in batches of {BATCH}, {ROUNDS} rounds")
    print(f"  records/s: best {max(rates):,.0f}, median {sorted(rates)[len(rates) // 2]:,.0f}, "
          f"rounds {', '.join(f'{r:,.0f}' for r in rates)}")
    save_results("decide", {"records": len(log), "batch": BATCH, "rates": [round(r) for r in rates]})
