"""Nothing stored stays undecided (I/O shell, runs inside `orderly fetcher`).

Every record the ingest acknowledged is in orderly.raw (or quarantine), and the worker
gives every one of them a decision, which the projector stores under its delivery id in
``webhook_events``. The worker acks a record only after its decision is in Kafka, so once the worker
group has committed past a record, its decision is in orderly.decisions; once the projector has
stored everything that was in orderly.decisions at that moment, the row must exist. A record with
no row by then was lost on the way (seen here: Faust skipping a record while two workers
rebalanced): the sweeper appends it again, byte for byte with its headers, so the worker decides
it. A lagging worker or projector is never mistaken for a loss.

Per partition it keeps the offset of the first record not yet known to be decided in
``projector_offsets`` (consumer ``sweeper``), so a restart does not rescan the log.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from app.kafka_client import client_options
from app.producer import KeyedProducer
from app.settings import Settings
from topics.catalog import REQUEST_BYTES, names
from topics.records import H_DELIVERY_ID, H_RECEIVED_AT, log_place, received_ms_or_none

log = logging.getLogger("orderly.sweeper")
CONSUMER = "sweeper"
MAX_PER_SWEEP = 50_000



def delivery_id_of(m: Any) -> str:
    """The id the worker decides a raw record under: its delivery_id header as the careful pass reads
    it (a value that is not UTF-8, with replacement characters; a null one, as none), else its place
    in the log, as the worker names a record without one."""
    value = dict(m.headers).get(H_DELIVERY_ID)
    return (value or b"").decode(errors="replace") or log_place(m.topic, m.partition, m.offset)

class Sweeper:
    def __init__(self, settings: Settings, pool: asyncpg.Pool, producer: KeyedProducer, on_reappend: Any) -> None:
        self.settings = settings
        self.pool = pool
        self.producer = producer
        self.on_reappend = on_reappend  # called with the topic of every record appended again
        n = names(settings.namespace)
        self.tps = [TopicPartition(n.raw, p) for p in range(settings.partitions)]
        self.reappended: dict[str, float] = {}  # delivery id -> when, so one is not appended every sweep
        # delivery id -> orderly.decisions' end offsets when it was first seen past the worker, undecided
        self.missing_since: dict[str, dict[int, int]] = {}
        self.decisions = [TopicPartition(names(settings.namespace).decisions, p) for p in range(settings.partitions)]
        self.admin: AIOKafkaAdminClient | None = None
        self.consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        # "earliest": assign() starts a reset to the default strategy at once, and aiokafka applies a
        # reset that completes after seek_to_beginning asked for another (fetcher.py checks only that
        # one is awaited); with "latest" the admin's start below gave it the time, and a partition
        # began at its end, its earlier records never swept (a test met it about one run in two)
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka_bootstrap, enable_auto_commit=False,
                                         max_partition_fetch_bytes=REQUEST_BYTES, auto_offset_reset="earliest",
                                         isolation_level="read_committed",  # end offsets: what the projector can read
                                         **client_options(self.settings))
        await self.consumer.start()
        self.consumer.assign(self.tps)
        self.admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap,
                                         **client_options(self.settings))
        await self.admin.start()
        stored = {(r["topic"], r["partition"]): r["next_offset"] for r in await self.pool.fetch(
            "SELECT topic, partition, next_offset FROM projector_offsets WHERE consumer = $1", CONSUMER)}
        for tp in self.tps:
            if (tp.topic, tp.partition) in stored:
                self.consumer.seek(tp, stored[(tp.topic, tp.partition)])
            else:
                await self.consumer.seek_to_beginning(tp)

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.admin is not None:
            await self.admin.close()

    async def sweep(self) -> int:
        """One pass; returns how many records were appended again."""
        assert self.consumer is not None and self.admin is not None
        cutoff_ms = (time.time() - self.settings.sweep_after_s) * 1000
        try:
            committed = await self.admin.list_consumer_group_offsets(f"{self.settings.namespace}-worker",
                                                                     partitions=self.tps)
        except KafkaError as exc:  # e.g. the group's coordinator is moving: the next pass will do
            log.info("sweep skipped: %r", exc)
            return 0
        # only what the worker group has moved past: the rest may simply not be decided yet
        ends = {tp: max(0, committed[tp].offset) if tp in committed else 0 for tp in self.tps}
        decisions_now = {tp.partition: end for tp, end in (await self.consumer.end_offsets(self.decisions)).items()}
        projected = {r["partition"]: r["next_offset"] for r in await self.pool.fetch(
            "SELECT partition, next_offset FROM projector_offsets WHERE consumer = 'projector' AND topic = $1",
            self.decisions[0].topic)}
        start = {tp: await self.consumer.position(tp) for tp in self.tps}
        old: dict[TopicPartition, list[Any]] = {tp: [] for tp in self.tps}
        young: set[TopicPartition] = set()
        seen = 0
        while seen < MAX_PER_SWEEP:
            pending = [tp for tp in self.tps if tp not in young and await self.consumer.position(tp) < ends[tp]]
            if not pending:
                break
            batch = await self.consumer.getmany(*pending, timeout_ms=500, max_records=5000)
            for tp, messages in batch.items():
                for m in messages:
                    if tp in young or m.offset >= ends[tp]:
                        continue
                    # a received_at that is no time (appended some other way) counts as old: checked now
                    if (received_ms_or_none(dict(m.headers).get(H_RECEIVED_AT)) or 0) > cutoff_ms:
                        young.add(tp)  # this one and the rest of the partition are checked later
                        continue
                    old[tp].append(m)
                    seen += 1
        ids = [delivery_id_of(m) for ms in old.values() for m in ms]
        # a record set aside to quarantine is handled too: only an operator's redrive appends it again
        decided = {r["delivery_id"] for r in await self.pool.fetch(
            "SELECT delivery_id FROM webhook_events WHERE delivery_id = ANY($1::text[]) "
            "UNION SELECT delivery_id FROM quarantine WHERE delivery_id = ANY($1::text[])", ids)}
        again: list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]] = []
        positions: dict[TopicPartition, int] = {}
        now = time.monotonic()
        for tp, messages in old.items():
            first_undecided = None
            for m in messages:
                delivery_id = delivery_id_of(m)
                if delivery_id in decided:
                    self.reappended.pop(delivery_id, None)
                    self.missing_since.pop(delivery_id, None)
                    continue
                if first_undecided is None:
                    first_undecided = m.offset
                then = self.missing_since.setdefault(delivery_id, decisions_now)
                if any(projected.get(p, 0) < end for p, end in then.items()):
                    continue  # the projector has not stored everything its decision could be in yet
                if now - self.reappended.get(delivery_id, -1e9) >= self.settings.sweep_after_s:
                    self.reappended[delivery_id] = now
                    again.append((tp.topic, m.key, m.value, list(m.headers)))
                    log.warning("%s[%d]@%d (delivery %s): the worker group committed past it and the projector "
                                "is past its decisions, but it has none: appended again", tp.topic, tp.partition,
                                m.offset, delivery_id)
            positions[tp] = (first_undecided if first_undecided is not None
                             else messages[-1].offset + 1 if messages else start[tp])
            self.consumer.seek(tp, positions[tp])  # the undecided and the young are read again next time
        if again:
            await self.producer.send_all(again)
            for topic, *_ in again:
                self.on_reappend(topic)
        if positions:
            await self.pool.executemany(
                "INSERT INTO projector_offsets (consumer, topic, partition, next_offset) VALUES ($1, $2, $3, $4) "
                "ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset",
                [(CONSUMER, tp.topic, tp.partition, offset) for tp, offset in positions.items()])
        return len(again)
