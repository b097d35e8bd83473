"""`orderly export --topic T --to FILE.parquet`: a projection topic as a Parquet file for analytics,
with the topic's published schema (I/O shell around topics/schemas.py). Also writes the published
schemas themselves: ``python -m app.export --write-schemas docs/schemas``.

The topic is read from its beginning, read_committed (records of aborted transactions never show),
up to its end offsets taken when the export starts, and written a row group at a time, so memory
stays bounded by one row group whatever the topic's size. Columns: the record's Kafka coordinates
(``kafka_partition``, ``kafka_offset``, ``kafka_timestamp_ms``, ``kafka_key``), its ``record_kind``,
then every top-level field of the topic's schemas (over all its kinds). A field whose values are
strings, integers or booleans in every kind is a column of that type; any other field (objects,
arrays, values of more than one type) is a column of JSON text, for DuckDB's json functions or
any JSON reader. The file's metadata holds the topic's schemas (``orderly.schemas``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from app.gateways import registry
from app.kafka_client import client_options
from app.settings import Settings
from topics.catalog import REQUEST_BYTES
from topics.schemas import Schema, build, columns, dumps, write

# Each gateway's orderly.state snapshot type (what its reducer's ``snapshot`` encodes), from its
# registry line's reducer: a gateway added to the registry brings its own.
STATE_SNAPSHOTS: dict[str, Any] = {name: g.reducer.snapshot_type for name, g in registry.GATEWAYS.items()
                                   if g.reducer.snapshot_type is not None}
PROJECTIONS = ("state", "decisions", "facts", "effects")
ROW_GROUP = 20_000
KAFKA_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()), ("kafka_timestamp_ms", pa.int64()),
    ("kafka_key", pa.string()), ("record_kind", pa.string())]
_SCALARS = {"string": pa.string(), "integer": pa.int64(), "boolean": pa.bool_()}


def published(namespace: str = "orderly") -> dict[str, Schema]:
    """Every published schema (docs/schemas/), by path."""
    return build(STATE_SNAPSHOTS, namespace)


def arrow_type(field: Schema) -> pa.DataType | None:
    """The column type of a field, or None for a field written as JSON text."""
    types: set[str] = set()
    for branch in field.get("anyOf", [field]):
        if "anyOf" in branch:
            return None
        declared = branch.get("type")
        if declared is None and "const" in branch:
            declared = "string" if isinstance(branch["const"], str) else None
        if declared is None:
            return None
        types |= {declared} if isinstance(declared, str) else set(declared)
    types.discard("null")
    return _SCALARS[types.pop()] if len(types) == 1 and next(iter(types)) in _SCALARS else None


@dataclass(frozen=True)
class Layout:
    """The Parquet columns of one topic: its fields, which of them are JSON text, the arrow schema."""

    fields: list[str]
    json_fields: frozenset[str]
    schema: pa.Schema


def layout(topic: str, schemas: Mapping[str, Schema]) -> Layout:
    found = columns(schemas, topic)
    if not found:
        raise ValueError(f"{topic} is not a projection topic (one of: {', '.join(PROJECTIONS)})")
    typed = {name: arrow_type(field) for name, field in found.items()}
    clash = set(typed) & {name for name, _ in KAFKA_COLUMNS}
    if clash:  # a schema change would hide a column: refused here, and by the unit tests first
        raise ValueError(f"{topic} has fields named like the export's own columns: {sorted(clash)}")
    arrow = pa.schema([*KAFKA_COLUMNS, *((name, t or pa.string()) for name, t in typed.items())], metadata={
        "orderly.topic": topic,
        "orderly.schemas": dumps({p: s for p, s in schemas.items() if s.get("x-orderly-topic") == topic})})
    return Layout(list(typed), frozenset(n for n, t in typed.items() if t is None), arrow)


def kind_of(topic_suffix: str, key: str, value: Mapping[str, Any]) -> str:
    if topic_suffix == "state":
        return key.partition(":")[0]
    if topic_suffix == "facts":
        return str(value.get("kind"))
    return topic_suffix.removesuffix("s")  # decisions -> decision, effects -> effect


class Batch:
    """One row group's values, column by column."""

    def __init__(self, shape: Layout) -> None:
        self.shape = shape
        self.values: dict[str, list[Any]] = {name: [] for name in shape.schema.names}

    def add(self, suffix: str, partition: int, offset: int, timestamp: int, key: str, value: dict[str, Any]) -> None:
        v = self.values
        v["kafka_partition"].append(partition)
        v["kafka_offset"].append(offset)
        v["kafka_timestamp_ms"].append(timestamp)
        v["kafka_key"].append(key)
        v["record_kind"].append(kind_of(suffix, key, value))
        json_fields = self.shape.json_fields
        for name in self.shape.fields:
            field = value.get(name)
            if name in json_fields and field is not None:
                field = orjson.dumps(field).decode()
            v[name].append(field)

    def __len__(self) -> int:
        return len(self.values["kafka_offset"])

    def table(self) -> pa.Table:
        return pa.Table.from_pydict(self.values, schema=self.shape.schema)


@dataclass(frozen=True)
class Exported:
    topic: str
    rows: int
    skipped: int  # tombstones (no value): none are written today
    seconds: float


async def _partitions(settings: Settings, topic: str) -> list[int]:
    """The topic's own partitions (the ORDERLY_PARTITIONS of the stack that made it), not this
    command's setting: a stack found through stack.json may run with another count than the default."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=15_000,
                                **client_options(settings))
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    partitions = sorted(p["partition"] for d in described if d["topic"] == topic for p in d["partitions"])
    if not partitions:
        raise ValueError(f"no topic {topic} in Kafka at {settings.kafka_bootstrap}")
    return partitions


async def export(settings: Settings, suffix: str, target: Path, row_group: int = ROW_GROUP) -> Exported:
    """orderly.<suffix> up to its end offsets now, into ``target`` (written beside, then renamed)."""
    if suffix not in PROJECTIONS:
        raise ValueError(f"--topic must be one of {', '.join(PROJECTIONS)} (or with the namespace), not {suffix!r}")
    topic = f"{settings.namespace}.{suffix}"
    shape = layout(topic, published(settings.namespace))
    started = time.monotonic()
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                                isolation_level="read_committed", max_partition_fetch_bytes=REQUEST_BYTES,
                                **client_options(settings))
    partial = target.with_name(target.name + ".partial")
    rows = skipped = 0
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in await _partitions(settings, topic)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        with pq.ParquetWriter(partial, shape.schema, compression="zstd") as writer:
            batch = Batch(shape)
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                for tp, messages in (await consumer.getmany(timeout_ms=500, max_records=row_group)).items():
                    for m in messages:
                        if m.offset >= ends[tp]:
                            continue
                        if m.value is None:
                            skipped += 1
                            continue
                        batch.add(suffix, tp.partition, m.offset, m.timestamp,
                                  m.key.decode(errors="replace") if m.key else "", orjson.loads(m.value))
                if len(batch) >= row_group:
                    writer.write_table(batch.table(), row_group_size=row_group)
                    rows += len(batch)
                    batch = Batch(shape)
            if len(batch):
                writer.write_table(batch.table(), row_group_size=row_group)
                rows += len(batch)
        partial.replace(target)
    finally:
        await consumer.stop()
        partial.unlink(missing_ok=True)
    return Exported(topic, rows, skipped, time.monotonic() - started)


def add_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--topic", required=True, help=f"one of {', '.join(PROJECTIONS)} (the namespace's)")
    command.add_argument("--to", required=True, type=Path, help="the Parquet file to write")
    command.add_argument("--row-group", type=int, default=ROW_GROUP, help=f"rows per row group (default {ROW_GROUP})")


def run(settings: Settings, args: argparse.Namespace) -> int:
    suffix = str(args.topic).removeprefix(f"{settings.namespace}.")
    try:
        done = asyncio.run(export(settings, suffix, args.to, args.row_group))
    except ValueError as exc:
        print(f"orderly export: {exc}", file=sys.stderr)
        return 2
    except KafkaError as exc:  # one line, as every command's connection failure (issue #48)
        print(f"orderly export: Kafka at {settings.kafka_bootstrap}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    rate = done.rows / done.seconds if done.seconds else 0.0
    print(f"{done.topic}: {done.rows} records to {args.to} in {done.seconds:.2f} s ({rate:,.0f} rows/s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.export", description="Write the published schemas.")
    parser.add_argument("--write-schemas", type=Path, required=True, metavar="DIR", help="e.g. docs/schemas")
    args = parser.parse_args(argv)
    for path in write(args.write_schemas, published()):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
