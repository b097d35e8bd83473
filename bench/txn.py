"""What Kafka transactions cost, apart from Orderly: the writes and commits of an exactly-once
worker's run in one transaction per source partition per commit (Faust's model, a worker's
without a static member id: a transactional producer per partition), in one transaction per
commit (one producer for the whole worker: a worker's with one, made safe by KIP-447 fencing,
app/seams/aiokafka.py), and with no transaction (an
idempotent producer: at-least-once's writes). After one run of each to warm the broker up, a round
runs each once on the same broker, the order turned by one each round; the figures are the
broker's and the client's CPU seconds per run.

The work is modelled on the worker's in a `bench e2e` run of 30,000 webhooks: about 130,000
records of 300 bytes to 4 topics of 12 partitions, in 50 batches, a commit every 3 batches.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from app.kafka_client import client_options
from app.settings import dev_settings
from bench.e2e import turned
from bench.stack import embedded, process_cpu, save_results
from topics.admin import ensure_topics
from topics.catalog import TopicSpec

PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", "12"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "4"))
TOPICS = 4  # decisions, effects, facts, state: the worker's outputs (its changelog is a fifth)
BATCHES = 50
COMMIT_EVERY = 3  # batches per commit: 17 commits a run, as the worker's 16-20
PER_BATCH = 54  # records per partition per topic per batch: 129,600 a run
VALUE = b"x" * 300
# in the order of the first round; each round turns it by one
VARIANTS = ("per_partition", "per_commit", "none")


async def create_topics(bootstrap: str, prefix: str, client: dict[str, Any]) -> None:
    """The run's topics, each partition written once (its leader known to the clients) before the timing."""
    await ensure_topics(bootstrap, [TopicSpec(f"{prefix}-out{k}", PARTITIONS, 1) for k in range(TOPICS)]
                        + [TopicSpec(f"{prefix}-source", PARTITIONS, 1)], **client)
    await asyncio.sleep(1.0)  # a partition created a moment ago answers its first writes "not the leader"
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(f"{prefix}-out{k}", b"ready", partition=p)
                               for k in range(TOPICS) for p in range(PARTITIONS)])
    finally:
        await producer.stop()


def producers(bootstrap: str, variant: str, prefix: str, client: dict[str, Any]) -> list[AIOKafkaProducer]:
    """One per partition (per_partition), else one; the worker's linger and batch size."""
    options = {"bootstrap_servers": bootstrap, "linger_ms": 5, "max_batch_size": 256 * 1024, **client}
    if variant == "per_partition":
        return [AIOKafkaProducer(transactional_id=f"{prefix}-{p}", **options) for p in range(PARTITIONS)]
    if variant == "per_commit":
        return [AIOKafkaProducer(transactional_id=f"{prefix}-worker", **options)]
    return [AIOKafkaProducer(enable_idempotence=True, acks="all", **options)]


async def commit(variant: str, kafka: Sequence[AIOKafkaProducer], prefix: str, offset: int, last: bool) -> None:
    """The offsets of every partition, in their transactions; then the next transactions begin."""
    if variant == "none":
        return

    async def one(producer: AIOKafkaProducer, partitions: range) -> None:
        await producer.send_offsets_to_transaction(
            {TopicPartition(f"{prefix}-source", p): offset for p in partitions}, f"{prefix}-group")
        await producer.commit_transaction()
        if not last:
            await producer.begin_transaction()

    if variant == "per_partition":
        await asyncio.gather(*(one(producer, range(p, p + 1)) for p, producer in enumerate(kafka)))
    else:
        await one(kafka[0], range(PARTITIONS))


async def run(bootstrap: str, broker_pid: int, variant: str, prefix: str, client: dict[str, Any]) -> dict[str, float]:
    """One run: the broker's and this process's CPU seconds, and the wall time, for the whole work."""
    await create_topics(bootstrap, prefix, client)
    kafka = producers(bootstrap, variant, prefix, client)
    for producer in kafka:
        await producer.start()
    try:
        if variant != "none":
            for producer in kafka:  # its transactional id registered, outside the timing
                async with producer.transaction():
                    await producer.send_and_wait(f"{prefix}-out0", b"warm", partition=0)
        broker_before, client_before, started = process_cpu(broker_pid), time.process_time(), time.perf_counter()
        if variant != "none":
            for producer in kafka:
                await producer.begin_transaction()
        pending: list[asyncio.Future[object]] = []
        for batch in range(BATCHES):
            for p in range(PARTITIONS):
                producer = kafka[p] if variant == "per_partition" else kafka[0]
                for k in range(TOPICS):
                    for _ in range(PER_BATCH):
                        pending.append(await producer.send(f"{prefix}-out{k}", VALUE, key=b"%d" % p, partition=p))
            await asyncio.sleep(0.01)  # the worker deciding its next batch
            last = batch == BATCHES - 1
            if (batch + 1) % COMMIT_EVERY == 0 or last:
                await asyncio.gather(*pending)  # the worker's flush: every write acknowledged first
                pending = []
                await commit(variant, kafka, prefix, batch + 1, last)
        wall = time.perf_counter() - started
        return {"broker_cpu_s": process_cpu(broker_pid) - broker_before,
                "client_cpu_s": time.process_time() - client_before, "wall_s": wall}
    finally:
        for producer in kafka:
            await producer.stop()


def main() -> None:
    records = BATCHES * PARTITIONS * TOPICS * PER_BATCH
    commits = -(-BATCHES // COMMIT_EVERY)
    runs: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
    with embedded("orderly-bench-txn-") as (_work, kafka, _postgres):
        assert kafka.pid is not None
        client = client_options(dev_settings({"ORDERLY_KAFKA": kafka.bootstrap}))  # the embedded broker's
        for variant in VARIANTS:  # a fresh broker's first transactions cost it several times more: not counted
            asyncio.run(run(kafka.bootstrap, kafka.pid, variant, f"warm-{variant}", client))
        for round_no in range(ROUNDS):
            line = f"round {round_no + 1}:"
            for variant in turned(list(VARIANTS), round_no):
                result = asyncio.run(run(kafka.bootstrap, kafka.pid, variant, f"r{round_no}-{variant}", client))
                runs[variant].append(result)
                line += (f" | {variant} broker {result['broker_cpu_s']:.2f} CPU-s, client "
                         f"{result['client_cpu_s']:.2f} CPU-s, {result['wall_s']:.2f} s")
            print(line, flush=True)
    print(f"\ntransactions: {records:,} records of {len(VALUE)} bytes to {TOPICS} topics of {PARTITIONS} partitions, "
          f"{BATCHES} batches, {commits} commits, per run; medians of {ROUNDS} rounds")
    summary: dict[str, dict[str, float]] = {}
    for variant, found in runs.items():
        summary[variant] = {key: statistics.median(r[key] for r in found) for key in found[0]}
        each = {key: ", ".join(f"{r[key]:.2f}" for r in found) for key in found[0]}
        print(f"  {variant:<14} broker {summary[variant]['broker_cpu_s']:.2f} CPU-s ({each['broker_cpu_s']}), "
              f"client {summary[variant]['client_cpu_s']:.2f} CPU-s ({each['client_cpu_s']})")
    save_results("txn", {"records": records, "commits": commits, "partitions": PARTITIONS,
                         "median": summary, "runs": runs})


if __name__ == "__main__":
    main()
