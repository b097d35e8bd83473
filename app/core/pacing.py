"""Pacing under load (pure): after a large batch, the next one is taken no sooner than an interval
after it, so that batches grow under load and each costs its fixed price (produce requests,
a PostgreSQL transaction) over more records, while at low load nothing waits."""

from __future__ import annotations

BUSY_BATCH = 100  # a batch this large or larger means the flow is busy
# A take cut short while a backlog waits is held for the next one at most this long (hold_take).
HOLD_MAX_S = 0.05


def busy_pause(batch_size: int, waiting: int, taken: float, now: float, interval: float, full: int) -> float:
    """Seconds to wait before taking the next batch: after a batch of BUSY_BATCH records or more
    taken at ``taken``, the next one is not taken before ``taken + interval``. None after a small
    batch (low load), nor when ``waiting`` records already make a ``full`` batch (a backlog: waiting
    would only slow the consumer down)."""
    return max(0.0, taken + interval - now) if batch_size >= BUSY_BATCH and waiting < full else 0.0


def hold_take(held: int, waiting: int, held_for: float, full: int) -> bool:
    """Whether to hold ``held`` records taken (those of earlier takes held too) for the next take
    instead of deciding them now: only while they are fewer than BUSY_BATCH, BUSY_BATCH or more
    records wait behind them (a backlog, so the next take comes at once), and the first of them was
    taken less than HOLD_MAX_S ago. A take's window is a fixed time in which its records are passed
    to it one per turn of the event loop; while other tasks crowd the loop (with exactly-once, a
    dozen producers sending the last batch's writes), it ends with a few records though thousands
    wait, and each such batch costs its fixed price again (a produce request per partition it
    touched), which crowds the loop further. At low load nothing waits behind a take, so nothing
    is held."""
    return held < BUSY_BATCH and waiting >= BUSY_BATCH and held_for < HOLD_MAX_S and held < full
