"""Delivery ids: the id the ingest gives each record it appends (I/O shell, per process)."""

from __future__ import annotations

import itertools
import uuid

# Delivery ids: a random 64-bit prefix per process and a counter. Unique across processes and
# restarts without a syscall per request (uuid4 reads os.urandom every time).
_ID_PREFIX = uuid.uuid4().hex[:16]
_id_counter = itertools.count()


def next_delivery_id() -> str:
    return f"{_ID_PREFIX}{next(_id_counter):012x}"
