"""`orderly replay --into NS`: rebuild state, topics and read models from the log (I/O shell).

1. Copy ``orderly.raw`` into ``NS.raw``, partition by partition, in log order. Every input that
   can change a decision is in it (webhooks, synced fetches, the merchant's correlations), so the
   rebuild decides each resource's records in the very order the live worker did.
2. Rebuild what the worker would have written (``rebuild``: its own reducers over the merged log,
   the partitions split across forked processes), then run a projector and an effects recorder
   for ``NS`` (effects are recorded, never delivered: no ``ORDERLY_EFFECTS_URL``) until every
   copied record has its decision projected.
3. Compare every read model of ``NS`` with the live one and report each difference.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from app.bootstrap import prepare
from app.core.dispatch import Incoming, Record, plan_batch
from app.gateways import registry
from app.kafka_client import client_options
from app.producer import KeyedProducer
from app.settings import Settings
from app.worker import changelog_topic
from projections.migrate import quote_ident
from topics.catalog import REQUEST_BYTES, names
from topics.records import H_DELIVERY_ID

Merged = dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes]]]]]  # partition -> (key, value, headers)
PROCESSES = ("projector", "effects")  # the worker's part is rebuild(), in this process
CHUNK = 20_000
# A rebuild splits the partitions across Settings.replay_processes processes (0: one per core), once
# the log has FORK_FROM records: below that a fork and a producer cost more.
FORK_FROM = 20_000
_forked: Merged = {}  # the log a forked rebuild process inherits

# table -> columns compared: each gateway's tables (app/gateways/registry.py), then the shared ones
SHARED_COMPARED = {
    "ledger_entries": "entry_key, user_id, amount_minor, source_id",
    "effects": "dedupe_key, type, gateway, resource_id, payload, caused_by",
    "webhook_events": "delivery_id, gateway, event_id, resource_id, event_type, outcome, error",
}


def compared() -> dict[str, str]:
    return {**{t.name: t.compared for g in registry.GATEWAYS.values() for t in g.tables}, **SHARED_COMPARED}


async def _read_all(bootstrap: str, topic: str, partitions: int, **client: Any) -> dict[int, list[Any]]:
    """Every record of ``topic`` up to its end at the start of the copy, per partition."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                isolation_level="read_committed", max_partition_fetch_bytes=REQUEST_BYTES, **client)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]  # co-partitioned: checked at start-up
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        found: dict[int, list[Any]] = {p: [] for p in range(partitions)}
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for tp, messages in (await consumer.getmany(timeout_ms=500, max_records=5000)).items():
                found[tp.partition] += [m for m in messages if m.offset < ends[tp]]
        return found
    finally:
        await consumer.stop()


async def merged_log(live: Settings) -> Merged:
    """orderly.raw per partition, in log order."""
    raw = await _read_all(live.kafka_bootstrap, names(live.namespace).raw, live.partitions, **client_options(live))
    return {partition: [(m.key, m.value, list(m.headers)) for m in messages]
            for partition, messages in sorted(raw.items())}


def deliveries(merged: Merged) -> int:
    """The deliveries the log holds, each one timeline row: a record appended again (a backfill or
    a card fetch repeated after a crash, the sweeper's re-append) keeps the delivery id of the first."""
    ids = [dict(headers).get(H_DELIVERY_ID) for records in merged.values() for _, _, headers in records]
    return len(set(ids)) - (None in ids) + ids.count(None)  # a record without an id is one of its own


async def unmigrated_correlations(live: Settings) -> bool:
    """Whether a pre-0.2 correlations topic still holds what the log lacks (`orderly migrate` moves it)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=live.kafka_bootstrap, **client_options(live))
    await admin.start()
    try:
        return names(live.namespace).correlations in await admin.list_topics()
    finally:
        await admin.close()


async def copy_log(target: Settings, merged: Merged) -> int:
    """The merged log into ``NS.raw``: the rebuilt namespace keeps its own log."""
    producer = KeyedProducer(target.kafka_bootstrap, **client_options(target))
    await producer.start()
    try:
        records = [(names(target.namespace).raw, key, value, headers)
                   for partition in sorted(merged) for key, value, headers in merged[partition]]
        for start in range(0, len(records), CHUNK):
            await producer.send_all(records[start:start + CHUNK])
    finally:
        await producer.stop()
    return len(records)


async def prepare_target(target: Settings) -> None:
    """What a rebuild into ``target`` writes to must exist first: the namespace's topics and tables
    (as every process ensures them) and the worker table's changelog topic."""
    await prepare(target)


def rebuild(target: Settings, merged: Merged, processes: int | None = None) -> int:
    """Decide the merged log with the worker's own reducers, record by record in log order per
    partition (what one worker would decide), and write what a worker would have written:
    decisions, effects and facts, one state snapshot per resource, the Faust table's changelog
    (its final state per resource) and the worker group's offsets at the end of ``NS.raw``, so a
    worker started on ``NS`` later carries on from here. Returns the number of decisions.

    Partitions share nothing, so a log of at least FORK_FROM records is split by size across
    ``processes`` (default: the target's replay_processes, 0 meaning one per core) forked
    processes, each inheriting the log.
    The target's topics must exist (prepare_target)."""
    global _forked
    processes = processes or target.replay_processes or os.cpu_count() or 1
    groups = _groups(merged, processes if sum(map(len, merged.values())) >= FORK_FROM else 1)
    if len(groups) <= 1:
        decided = asyncio.run(_rebuild_partitions(target, merged, groups[0] if groups else []))
    else:
        _forked = merged
        try:
            decided = _run_forked(target, groups)
        finally:
            _forked = {}
    asyncio.run(_commit_worker_offsets(target, {p: len(records) for p, records in merged.items()}))
    return decided


def _groups(merged: Merged, count: int) -> list[list[int]]:
    """The partitions in ``count`` groups of about equal record counts (largest first, each to the
    least loaded group); each group sorted."""
    groups: list[tuple[int, list[int]]] = [(0, []) for _ in range(max(1, min(count, len(merged))))]
    for partition in sorted(merged, key=lambda p: -len(merged[p])):
        size, members = min(groups, key=lambda g: g[0])
        groups.remove((size, members))
        groups.append((size + len(merged[partition]), [*members, partition]))
    return [sorted(members) for _, members in groups if members]


def _run_forked(target: Settings, groups: list[list[int]]) -> int:
    """Rebuild each group of partitions in a forked process (each inherits the log); the sum of
    their decisions. A process that fails or dies fails the rebuild, naming why."""
    context = multiprocessing.get_context("fork")
    children = []
    for group in groups:
        reader, writer = context.Pipe(duplex=False)
        child = context.Process(target=_rebuild_forked, args=(writer, target, group), daemon=True)
        child.start()
        writer.close()
        children.append((child, reader))
    decided, failures = 0, []
    for child, reader in children:
        try:
            ok, value = reader.recv()
        except EOFError:
            ok, value = False, "it ended without an answer"
        child.join()
        if ok:
            decided += value
        else:
            failures.append(f"process {child.pid} (exit code {child.exitcode}): {value}")
    if failures:
        raise RuntimeError("rebuild failed: " + "; ".join(failures))
    return decided


def _rebuild_forked(answer: Any, target: Settings, partitions: list[int]) -> None:
    # A short-lived process that ends with os._exit: what it allocates is freed by reference
    # counting or with the process, so the cycle collector only costs time here.
    gc.disable()
    try:
        result: tuple[bool, Any] = (True, asyncio.run(_rebuild_partitions(target, _forked, partitions)))
    except BaseException as exc:  # reported to the parent, which fails the rebuild
        result = (False, f"{type(exc).__name__}: {exc}")
    try:
        answer.send(result)
        answer.close()
    finally:
        # no interpreter teardown: freeing the inherited log object by object took ~80 ms
        os._exit(0 if result[0] else 1)


async def _rebuild_partitions(target: Settings, merged: Merged, partitions: list[int]) -> int:
    n = names(target.namespace)
    changelog = changelog_topic(target.namespace)
    producer = KeyedProducer(target.kafka_bootstrap, **client_options(target))
    await producer.start()
    decided = 0
    try:
        out: list[Record] = []  # the current partition's outputs (the worker's rule)
        in_flight: Awaitable[Any] | None = None

        async def hand_over(partition: int) -> None:  # Kafka acknowledges one chunk while the next is decided
            nonlocal in_flight, out
            if in_flight is not None:
                await in_flight
            in_flight = await producer.enqueue_partitioned({partition: out})
            out = []
            for _ in range(4):  # let aiokafka's sender write the requests before deciding on
                await asyncio.sleep(0)

        for partition in partitions:
            # a resource's records are all in one partition: its state is final at the partition's end
            states: dict[bytes, bytes] = {}
            log = merged[partition]
            for start in range(0, len(log), CHUNK):  # the live worker's rules, a chunk at a time
                chunk = [Incoming(key, value, headers, offset, partition, n.raw)
                         for offset, (key, value, headers) in enumerate(log[start:start + CHUNK], start=start)]
                plan = plan_batch(n, registry.GATEWAYS, chunk, partial(_known, states))
                states.update(plan.states)
                decided += sum(plan.outcomes.values())
                out += plan.records.get(partition, [])
                if start + CHUNK < len(log):
                    await hand_over(partition)
            # the partition's changelog goes out while the next partition is decided
            out += [(changelog, key, state) for key, state in states.items()]
            await hand_over(partition)
        if in_flight is not None:
            await in_flight
    finally:
        await producer.stop()
    return decided


def _known(states: dict[bytes, bytes], _partition: int, key: bytes) -> bytes | None:
    return states.get(key)


async def ensure_changelog(target: Settings) -> str:
    """The worker table's changelog topic (compacted, co-partitioned): part of the catalog, so
    prepare() creates it with every other topic."""
    await prepare(target)
    return changelog_topic(target.namespace)


async def _commit_worker_offsets(target: Settings, ends: dict[int, int]) -> None:
    n = names(target.namespace)
    consumer = AIOKafkaConsumer(bootstrap_servers=target.kafka_bootstrap, group_id=f"{target.namespace}-worker",
                                enable_auto_commit=False, **client_options(target))
    await consumer.start()
    try:
        offsets = {TopicPartition(n.raw, p): end for p, end in ends.items() if end}
        consumer.assign(list(offsets))
        if offsets:
            await consumer.commit(offsets)
    finally:
        await consumer.stop()


async def diff(live: Settings, target: Settings) -> dict[str, tuple[int, int]]:
    """Per table: (rows only live has, rows only the rebuild has)."""
    conn = await asyncpg.connect(live.postgres_dsn.reveal())
    a, b = quote_ident(live.namespace), quote_ident(target.namespace)
    try:
        out = {}
        for table, cols in compared().items():
            only_live = await conn.fetchval(f"SELECT count(*) FROM (SELECT {cols} FROM {a}.{table} "
                                            f"EXCEPT SELECT {cols} FROM {b}.{table}) x")
            only_new = await conn.fetchval(f"SELECT count(*) FROM (SELECT {cols} FROM {b}.{table} "
                                           f"EXCEPT SELECT {cols} FROM {a}.{table}) x")
            out[table] = (int(only_live), int(only_new))
        return out
    finally:
        await conn.close()


async def _count(settings: Settings, query: str) -> int:
    conn = await asyncpg.connect(settings.postgres_dsn.reveal(),
                                 server_settings={"search_path": quote_ident(settings.namespace)})
    try:
        return int(await conn.fetchval(query))
    finally:
        await conn.close()


def replay(live: Settings, into: str, logs: Path, limit_s: float = 600) -> int:
    if into == live.namespace:
        raise SystemExit("orderly replay: --into must name a namespace other than the live one")
    # its workers join as dynamic members: a live worker's static id is not theirs
    target = live.with_overrides(namespace=into, effects_url=None, worker_instance_id=None)
    asyncio.run(prepare_target(target))
    if asyncio.run(_count(target, "SELECT count(*) FROM webhook_events")):
        raise SystemExit(f"orderly replay: namespace {into!r} is not fresh (it already has deliveries)")
    if asyncio.run(unmigrated_correlations(live)):
        raise SystemExit(f"orderly replay: {names(live.namespace).correlations} still exists; run `orderly migrate` "
                         "(or start a worker) to move its correlations into the log first")
    started = time.monotonic()
    merged = asyncio.run(merged_log(live))
    copied = asyncio.run(copy_log(target, merged))
    expected = deliveries(merged)  # what the rebuilt timeline holds once every copied record is projected
    rebuilt_at = time.monotonic()
    decided = rebuild(target, merged)
    rebuild_s = time.monotonic() - rebuilt_at
    env = {k: v for k, v in os.environ.items() if k != "ORDERLY_EFFECTS_URL"}
    env.update(target.to_env())
    env.pop("ORDERLY_EFFECTS_URL", None)  # recorded, never delivered
    # no /metrics: the port the live processes were given is theirs (two children on it: one died)
    env["ORDERLY_METRICS_PORT"] = "0"
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for name in PROCESSES:
        with (logs / f"replay-{into}-{name}.log").open("ab") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "app.cli", name], env=env, stdout=out,
                                          stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + limit_s
        live_effects = asyncio.run(_count(live, "SELECT count(*) FROM effects"))
        while True:
            done = asyncio.run(_count(target, "SELECT count(*) FROM webhook_events"))
            effects = asyncio.run(_count(target, "SELECT count(*) FROM effects"))
            if done >= expected and effects >= live_effects:
                break
            dead = [(name, proc.returncode) for name, proc in zip(PROCESSES, procs, strict=True)
                    if proc.poll() is not None]
            if dead:  # it would never catch up: said now, with where to look, not after the deadline
                print(f"replay: {', '.join(f'{n} exited with {c}' for n, c in dead)} before catching up; see "
                      f"{logs}/replay-{into}-<process>.log", file=sys.stderr)
                break
            if time.monotonic() > deadline:  # the differences below then include what was not rebuilt yet
                print(f"replay: not caught up within {limit_s:.0f} s: {done} of {expected} deliveries decided, "
                      f"{effects} of {live_effects} effects recorded", file=sys.stderr)
                break
            time.sleep(0.5)
        time.sleep(1.0)  # let the effects recorder take its last batch
    finally:
        for proc in procs:
            os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
    elapsed = time.monotonic() - started
    report = asyncio.run(diff(live, target))
    print(f"replayed {copied} records from {live.namespace} into {into} in {elapsed:.1f} s: state and "
          f"{decided} decisions rebuilt in {rebuild_s:.2f} s ({copied / max(rebuild_s, 1e-3):.0f} records/s), "
          f"read models projected by then; effects recorded, not delivered")
    differing = {t: d for t, d in report.items() if d != (0, 0)}
    for table, (only_live, only_new) in report.items():
        verdict = "same" if (only_live, only_new) == (0, 0) else f"{only_live} rows only live, {only_new} only rebuilt"
        print(f"  {table:<30} {verdict}")
    print("no difference from the live namespace" if not differing else f"{len(differing)} table(s) differ")
    return 1 if differing else 0
