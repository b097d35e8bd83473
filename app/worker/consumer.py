"""The worker's consumer's pacing: commits paced by load, fetches sized by load (pure rules, which
app/seams/faust/consumer.py and app/worker/runtime.py apply)."""

from __future__ import annotations

from app.core.pacing import BUSY_BATCH

# Under load the fetches grow: after a busy batch the worker's fetches ask the broker for at
# least this much (or app/seams/faust/consumer.py's FETCH_MAX_WAIT_MS), after a small one for
# any record at all. Asking for any record while the ingest appends thousands a second returns a
# fetch per few records, each costing the worker's consumer thread and the broker a request for
# every partition.
BUSY_FETCH_MIN_BYTES = 256 * 1024

# Commits adapt to load the way batches do (app/core/pacing.py): after a commit that covered
# BUSY_COMMIT_RECORDS records or more, the next one comes after the busy commit interval
# (ORDERLY_BUSY_COMMIT_INTERVAL_S) instead of the commit interval, or as soon as the worker has been
# idle for the quiet time (no batch taken or finished: the flow stopped, and its tail is not held
# back). With exactly-once every commit is a transaction per partition with new records, and the
# projector sees a decision only once its transaction commits: at low load short commit intervals
# keep the latency down; under load, commits that each cover hundreds of records spare the broker
# most of the transactions.
BUSY_COMMIT_RECORDS = 250
QUIET_MARGIN_S = 0.05  # the quiet time is longer than a busy worker's pause between batches by this


def quiet_after(busy_interval: float) -> float:
    """How long without a batch means the flow stopped, for a worker pausing ``busy_interval`` between busy batches."""
    return busy_interval + QUIET_MARGIN_S


def next_commit_wait(covered: int, interval: float, busy_interval: float) -> float:
    """Seconds from the end of a commit that covered ``covered`` records to the next commit."""
    return busy_interval if covered >= BUSY_COMMIT_RECORDS else interval


def commit_due(since_commit: float, wait: float, since_batch: float, quiet: float) -> bool:
    """Whether to commit now, ``since_commit`` seconds after the last commit with ``wait`` chosen
    for the next, and ``since_batch`` seconds after a batch was last taken or finished."""
    return since_commit >= wait or since_batch >= quiet


def fetch_min_bytes(batch_size: int) -> int:
    """What the worker's next fetches wait for, given the size of the batch it just decided."""
    return BUSY_FETCH_MIN_BYTES if batch_size >= BUSY_BATCH else 1
