"""Pacing under load (pure): after a large batch, the next one is taken no sooner than an interval
after it, so that batches grow under load and each costs its fixed price (produce requests,
a PostgreSQL transaction) over more records, while at low load nothing waits."""

from __future__ import annotations

BUSY_BATCH = 100  # a batch this large or larger means the flow is busy


def busy_pause(batch_size: int, waiting: int, taken: float, now: float, interval: float, full: int) -> float:
    """Seconds to wait before taking the next batch: after a batch of BUSY_BATCH records or more
    taken at ``taken``, the next one is not taken before ``taken + interval``. None after a small
    batch (low load), nor when ``waiting`` records already make a ``full`` batch (a backlog: waiting
    would only slow the consumer down)."""
    return max(0.0, taken + interval - now) if batch_size >= BUSY_BATCH and waiting < full else 0.0
