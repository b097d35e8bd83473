"""The partition of a key: Kafka's default (Java) partitioner, murmur2 of the key bytes.

Every producer of a resource's records must agree on it, because one agent instance owns a
resource only if all its topics put the resource on the same partition number.
"""

from __future__ import annotations

from functools import lru_cache

from aiokafka.partitioner import murmur2


@lru_cache(maxsize=1 << 16)
def _hash(key: bytes) -> int:
    return int(murmur2(key)) & 0x7FFFFFFF


def partition_for(key: bytes, partitions: int) -> int:
    return _hash(key) % partitions
