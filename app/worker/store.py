"""The worker's table and its local store, read and written a partition at a time (I/O shell)."""

from __future__ import annotations

import contextlib
import types
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from faust.streams import _current_event
from faust.types import TP
from rocksdict import WriteBatch

from topics.catalog import names

TABLE = "resources"

# One RocksDB per owned partition. Faust's defaults (3 x 64 MiB memtables and a 2 GiB block cache,
# per partition) would let a worker owning a dozen partitions grow to tens of GiB; these keep the
# hot part in memory and the rest of the state on disk.
ROCKSDB_OPTIONS = {"driver": "rocksdict", "write_buffer_size": 4 << 20, "max_write_buffer_number": 2,
                   "block_cache_size": 16 << 20}


def changelog_topic(namespace: str) -> str:
    """The Faust changelog of the worker's table (Faust names it ``{app id}-{table}-changelog``)."""
    return names(namespace).changelog


class PartitionStore:
    """The table's local store, read and written a partition at a time. With RocksDB a batch's new
    values and the changelog offset they reach go into the partition's database as one WriteBatch:
    one write instead of Faust's write per key, and the offset can never get ahead of the values.
    Another store (memory) is written through Faust's table API as if inside an event of the
    partition."""

    def __init__(self, store: Any, changelog: str) -> None:
        self.store = store
        self.changelog = changelog
        self.rocksdb = bool(getattr(store, "use_rocksdict", False))  # Faust's RocksDB store, rocksdict driver

    def get(self, partition: int, key: bytes) -> bytes | None:
        value: bytes | None
        if self.rocksdb:
            value = self.store._db_for_partition(partition).get(key)
            return value
        with inside(PartitionEvent(partition)):
            value = self.store.get(key)
            return value

    def write(self, partition: int, values: Iterable[tuple[bytes, bytes]], offset: int | None) -> None:
        """Write ``values`` and (if not None) the changelog offset they reach, for ``partition``."""
        if self.rocksdb:
            batch = WriteBatch(raw_mode=True)
            for key, value in values:
                batch.put(key, value)
            if offset is not None:
                batch.put(self.store.offset_key, str(offset).encode())
            self.store._db_for_partition(partition).write(batch)
            return
        with inside(PartitionEvent(partition)):
            for key, value in values:
                self.store[key] = value
        if offset is not None:
            self.store.set_persisted_offset(TP(self.changelog, partition), offset)


class PartitionEvent:
    """Stands for an event of ``partition`` where Faust's store asks the current event which
    partition's database to use."""

    def __init__(self, partition: int) -> None:
        self.message = types.SimpleNamespace(partition=partition)


@contextlib.contextmanager
def inside(event: Any) -> Iterator[None]:
    """Read or write the table as if inside ``event``'s iteration: Faust's RocksDB store uses the
    current event's partition (without one, a read of a new key looks in every partition's
    database). Only this task's context variable is touched: changing the stream's own current
    event instead would make take_events() buffer the wrong event for a record that arrives
    meanwhile (seen here as one record processed twice and the next one lost)."""
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)
