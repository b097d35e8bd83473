"""A Kafka-to-PostgreSQL sink whose consumed offsets live in the same transaction as its rows.

Kafka's committed offsets are not used at all: on assignment each partition resumes from
``projector_offsets``, and inside every batch transaction the stored offset is locked and records
below it are skipped. A crash, a redelivery or two instances overlapping during a rebalance
therefore write each record once (the eventsourcing "tracking record" pattern).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.structs import ConsumerRecord

from app import pg_pool
from app.core.pacing import busy_pause
from app.group_session import session_refusal
from app.kafka_client import client_options
from app.readiness import UNREACHABLE
from app.seams import aiokafka as kafka_seam
from app.settings import Settings, SettingsError
from app.waits import within
from projections import sql
from projections.bulk import Conn, printable
from topics.catalog import REQUEST_BYTES

log = logging.getLogger("orderly.sink")
Apply = Callable[[Conn, list[ConsumerRecord]], Awaitable[None]]
SetAside = Callable[[ConsumerRecord, str], Awaitable[None]]
# What stops a sink's batch: PostgreSQL out of reach (app/readiness.py: its process waits for it and
# resumes). Anything else a record causes is the record's, and the record is set aside (DESIGN.md §2.4).
REASON_MAX = 500
DETAIL_BYTES = 1000  # of a refused value, in projection_errors (whose unique index takes ~8 KB a row)
# How the sink's fetches wait (app/seams/aiokafka.py set_fetch_pace). While records come, the broker
# holds a fetch up to 40 ms for 64 KiB rather than answer every few records: fewer, larger fetches
# cost it far less CPU, and every batch is a PostgreSQL transaction. Once polls have found nothing
# for QUIET_AFTER_S, a fetch asks for any byte, so the broker answers the first record at once, and
# otherwise holds it 250 ms: an idle sink asks 4 times a second, not 25 (measured idle: the
# projector's and the effects' CPU about a third of what it was, the broker's a little over half;
# docs/benchmarks.md). What that costs: the client has one fetch in flight per broker, and Kafka
# answers a connection's requests in order, so what comes after an idle fetch waits for it, up to
# 250 ms where it waited 40: the first fetch after a seek or a rebalance, lag()'s end offsets, and a
# partition left out of the fetch in flight because its records were not read yet (a slow turn of
# the process's loop). Not at the first empty poll, so that the end of a burst (a load's last
# decisions, the records of a commit) does not meet such a fetch.
BUSY_FETCH = (64 * 1024, 40)  # (min bytes, max wait ms)
QUIET_FETCH = (1, 250)
QUIET_AFTER_S = 1.0


class _Resume(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, sink: PgSink) -> None:
        self.sink = sink

    async def on_partitions_revoked(self, revoked: Any) -> None:
        return None

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.sink.seek_to_stored(list(assigned))


class PgSink:
    def __init__(self, settings: Settings, name: str, topic: str, apply: Apply, max_records: int = 2000,
                 set_aside: SetAside | None = None) -> None:
        self.settings = settings
        self.name = name
        self.topic = topic
        self.apply = apply
        self.set_aside = set_aside  # where a record the sink cannot write goes, besides projection_errors
        self.max_records = max_records
        self.pool: asyncpg.Pool | None = None
        self.consumer: AIOKafkaConsumer | None = None
        self.quiet = False  # the fetches' pace: QUIET_FETCH once polls found nothing for QUIET_AFTER_S
        self.empty_since: float | None = None  # the first of the empty polls in a row

    async def start(self) -> None:
        # the brokers' session bounds are read while the pool connects: no wait added to a restart
        refused = asyncio.ensure_future(session_refusal(self.settings))
        self.pool = await pg_pool.create_pool(self.settings.postgres_dsn.reveal(), self.settings.namespace,
                                              min_size=1, max_size=4)
        if (reason := await refused) is not None:
            raise SettingsError(reason)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap, group_id=f"{self.settings.namespace}-{self.name}",
            enable_auto_commit=False, isolation_level="read_committed", auto_offset_reset="earliest",
            max_poll_records=self.max_records, session_timeout_ms=round(self.settings.session_timeout_s * 1000),
            heartbeat_interval_ms=round(self.settings.heartbeat_interval_s * 1000),
            group_instance_id=self.settings.instance_member,  # static membership (ORDERLY_INSTANCE_ID)
            fetch_min_bytes=BUSY_FETCH[0], fetch_max_wait_ms=BUSY_FETCH[1],  # then paced by run_once
            max_partition_fetch_bytes=REQUEST_BYTES,  # never a record too large to read
            **client_options(self.settings))
        self.consumer.subscribe([self.topic], listener=_Resume(self))
        await self.consumer.start()
        self.quiet, self.empty_since = False, None  # a new consumer starts on BUSY_FETCH

    async def stop(self) -> None:
        try:
            if self.consumer is not None:
                await self.consumer.stop()
        finally:  # aiokafka 0.14's stop raises CancelledError with a broker away (Fetcher.close): the pool still closes
            if self.pool is not None:
                await self.pool.close()

    async def seek_to_stored(self, partitions: list[TopicPartition]) -> None:
        assert self.pool is not None and self.consumer is not None
        rows = await self.pool.fetch(sql.SELECT_OFFSETS, self.name, self.topic)
        stored = {r["partition"]: r["next_offset"] for r in rows}
        for tp in partitions:
            if tp.partition in stored:
                self.consumer.seek(tp, stored[tp.partition])
            else:
                await self.consumer.seek_to_beginning(tp)
        log.info("%s assigned %s; resuming at %s", self.name, sorted(p.partition for p in partitions),
                 {p: stored.get(p) for p in sorted(t.partition for t in partitions)})

    async def run_once(self, timeout_ms: int = 200) -> int:
        """Consume one batch and write it in one transaction; returns the records written. After
        a busy batch it waits (busy_pause) before returning, so that the next one grows."""
        assert self.pool is not None and self.consumer is not None
        batch = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=self.max_records)
        self._pace(bool(batch))
        if not batch:
            return 0
        taken = time.monotonic()
        try:
            written = await self._write(batch)
        except UNREACHABLE:
            # the batch is taken again once PostgreSQL is back: nothing of it was written (one
            # transaction), and the consumer's position is already past it
            mine = self.consumer.assignment()
            for tp, messages in batch.items():
                if tp in mine:
                    self.consumer.seek(tp, messages[0].offset)
            raise
        size = sum(len(messages) for messages in batch.values())
        # Under load a sink's batches are let grow like the worker's (app/core/pacing.py): after a batch
        # of 100+ records it takes the next one no sooner than sink_busy_interval_s after it, unless a
        # full batch was taken (a backlog). Every batch is a PostgreSQL transaction with a fixed cost
        # (the offsets' lock and upsert, the sequence bookkeeping, a statement per table); at low load
        # nothing waits. What waits is not known here: a full batch stands for a backlog.
        pause = busy_pause(size, size, taken, time.monotonic(), self.settings.sink_busy_interval_s,
                            self.max_records)
        if pause:
            await asyncio.sleep(pause)
        return written

    def _pace(self, found: bool) -> None:
        """BUSY_FETCH from a poll that found records on, QUIET_FETCH once polls found none for QUIET_AFTER_S."""
        if found:
            self.empty_since = None
        elif self.empty_since is None:
            self.empty_since = time.monotonic()
        quiet = self.empty_since is not None and time.monotonic() - self.empty_since >= QUIET_AFTER_S
        if quiet != self.quiet:
            self.quiet = quiet
            kafka_seam.set_fetch_pace(self.consumer, *(QUIET_FETCH if quiet else BUSY_FETCH))

    async def _write(self, batch: dict[TopicPartition, list[ConsumerRecord]]) -> int:
        assert self.pool is not None
        partitions = [tp.partition for tp in batch]
        async with self.pool.acquire() as conn, conn.transaction():
            stored = {r["partition"]: r["next_offset"]
                      for r in await conn.fetch(sql.LOCK_OFFSETS, self.name, self.topic, partitions)}
            fresh = {tp.partition: [m for m in messages if m.offset >= stored.get(tp.partition, -1)]
                     for tp, messages in batch.items()}
            fresh = {partition: messages for partition, messages in fresh.items() if messages}
            if not fresh:
                return 0
            # one apply for the whole batch: a statement per table, not per table and partition
            await self._apply_guarded(conn, [m for messages in fresh.values() for m in messages])
            await conn.execute(sql.UPSERT_OFFSETS, self.name, self.topic, list(fresh),
                               [messages[-1].offset + 1 for messages in fresh.values()])
        return sum(len(messages) for messages in fresh.values())

    async def _apply_guarded(self, conn: Conn, messages: list[ConsumerRecord]) -> None:
        """Apply the batch; if that fails (PostgreSQL refuses a row, or a record is not what the
        sink expects), apply record by record and set aside the ones that fail, with the reason,
        in projection_errors and through ``set_aside`` (orderly.quarantine): one bad record cannot
        wedge the sink, and nothing that failed is half-written. Only PostgreSQL out of reach
        stops the sink (its supervisor restarts it and it resumes from the stored offsets)."""
        try:
            async with conn.transaction():  # a savepoint
                await self.apply(conn, messages)
            return
        except UNREACHABLE:
            raise
        except Exception as exc:  # found and set aside record by record below
            log.error("%s: batch failed (%s: %s); retrying record by record", self.name, type(exc).__name__, exc)
        for message in messages:
            try:
                async with conn.transaction():
                    await self.apply(conn, [message])
            except UNREACHABLE:
                raise
            except Exception as exc:  # whatever the record does, it is set aside
                reason = printable(f"{type(exc).__name__}: {exc}"[:REASON_MAX])
                log.error("%s: %s[%d]@%d set aside: %s", self.name, message.topic, message.partition,
                          message.offset, reason)
                if self.set_aside is not None:  # the record itself, whole, to orderly.quarantine
                    try:
                        await self.set_aside(message, reason)
                    except MessageSizeTooLargeError as exc:  # an older quarantine topic's limit: noted below
                        log.error("%s: %s[%d]@%d is too large for the quarantine topic (%s)", self.name,
                                  message.topic, message.partition, message.offset, exc)
                await self._note_refused(conn, message, reason)

    async def _note_refused(self, conn: Conn, message: ConsumerRecord, reason: str) -> None:
        """A line in projection_errors: where the record was and why, with the start of its value
        and its digest (the whole value is in the quarantine). Its failure never stops the sink."""
        value = message.value or b""
        detail = {"error": reason, "value_sha256": hashlib.sha256(value).hexdigest(), "value_bytes": len(value),
                  "value_start": printable(value[:DETAIL_BYTES].decode(errors="replace"))}
        try:
            async with conn.transaction():
                await conn.execute(sql.INSERT_ERROR, f"{self.name}_refused",
                                   f"{message.topic}:{message.partition}:{message.offset}",
                                   orjson.dumps(detail).decode())
        except UNREACHABLE:
            raise
        except Exception as exc:  # the quarantine has the record; a note that cannot be written is only logged
            log.error("%s: could not note %s[%d]@%d in projection_errors: %s", self.name, message.topic,
                      message.partition, message.offset, exc)

    async def lag(self) -> int:
        """Records of the topic not consumed yet, over every partition: its end offsets less the
        positions stored in PostgreSQL, or this consumer's own position where it is further (past a
        transaction's commit marker, which no stored position covers)."""
        assert self.pool is not None and self.consumer is not None
        tps = [TopicPartition(self.topic, p) for p in sorted(self.consumer.partitions_for_topic(self.topic) or ())]
        if not tps:
            return 0
        ends = await self.consumer.end_offsets(tps)
        try:
            stored = {r["partition"]: r["next_offset"] for r in await self.pool.fetch(sql.SELECT_OFFSETS, self.name,
                                                                                       self.topic)}
        except UNREACHABLE:  # PostgreSQL away: this consumer's own positions, so the lag still shows it grow
            stored = {}
        mine = self.consumer.assignment()
        lag = 0
        for tp in tps:
            consumed = stored.get(tp.partition, 0)
            if tp in mine:
                with contextlib.suppress(Exception):  # no position yet (being assigned): the stored one
                    consumed = max(consumed, await within(self.consumer.position(tp), 1.0))
            lag += max(0, ends[tp] - consumed)
        return lag

    async def drain(self, idle_s: float = 1.0, limit_s: float = 60.0) -> int:
        """Run until nothing arrives for ``idle_s`` with every record of the topic consumed (tests):
        a slow join, or a fetch not answered yet, is not quiet."""
        assert self.consumer is not None
        total, quiet_since, deadline = 0, time.monotonic(), time.monotonic() + limit_s
        while time.monotonic() < deadline:
            n = await self.run_once()
            total += n
            if n or not self.consumer.assignment() or await self.lag() > 0:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > idle_s:
                break
        return total
