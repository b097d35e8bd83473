"""What the worker's batches tell its commits: one typed object the runtime and the commit share (I/O shell)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiokafka import TopicPartition

from app.metrics import WorkerMetrics
from app.seams.aiokafka import Membership
from app.worker.transactions import TransactionStage


@dataclass
class WorkerState:
    """Written by the batches, read by the commits that Faust's consumer asks for (app/worker/commit.py)."""

    metrics: WorkerMetrics
    busy_commit_interval: float  # the wait after a commit that covered many records
    quiet_s: float  # no batch taken or finished for this long: the flow stopped, commit its tail now
    # partition -> the offset after the last record decided; aiokafka's TopicPartition (equal to
    # Faust's TP), the only key its send_offsets_to_transaction takes
    decided: dict[TopicPartition, int] = field(default_factory=dict)
    stage: TransactionStage | None = None  # exactly-once only: the writes waiting for their transaction
    last_batch_at: float = 0.0  # time.monotonic() when a batch was last taken or finished
    # exactly-once: the group membership the offsets of the commit under way were taken in, and the
    # generation of the assignment the decided offsets belong to (None between a revocation and the
    # next assignment; Faust skips both signals while it stops)
    commit_membership: Membership | None = None
    assigned_generation: int | None = None
