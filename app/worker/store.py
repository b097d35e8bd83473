"""The worker's table and its local store, read and written a partition at a time (I/O shell)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from faust.types import TP
from rocksdict import WriteBatch

from app.seams.faust import PartitionEvent, inside, is_rocksdict, partition_db
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
        self.rocksdb = is_rocksdict(store)  # Faust's RocksDB store, rocksdict driver

    def get(self, partition: int, key: bytes) -> bytes | None:
        value: bytes | None
        if self.rocksdb:
            value = partition_db(self.store, partition).get(key)
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
            partition_db(self.store, partition).write(batch)
            return
        with inside(PartitionEvent(partition)):
            for key, value in values:
                self.store[key] = value
        if offset is not None:
            self.store.set_persisted_offset(TP(self.changelog, partition), offset)
