"""What the worker's batches tell its consumer's commits: one typed object on the Faust app (I/O shell)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import faust
from aiokafka import TopicPartition
from faust.types import AppT

from app.metrics import WorkerMetrics
from app.worker.transactions import TransactionStage


@dataclass
class WorkerState:
    """Written by the batches, read by the consumer that Faust builds (and times) itself."""

    metrics: WorkerMetrics
    busy_commit_interval: float  # the wait after a commit that covered many records
    quiet_s: float  # no batch taken or finished for this long: the flow stopped, commit its tail now
    # partition -> the offset after the last record decided; aiokafka's TopicPartition (equal to
    # Faust's TP), the only key its send_offsets_to_transaction takes
    decided: dict[TopicPartition, int] = field(default_factory=dict)
    stage: TransactionStage | None = None  # exactly-once only: the writes waiting for their transaction
    last_batch_at: float = 0.0  # time.monotonic() when a batch was last taken or finished


class WorkerApp(faust.App):
    """Faust's app with the worker's state, where the consumer (which Faust creates) finds it."""

    worker_state: WorkerState
    kafka_client: tuple[str, dict[str, Any]]  # the bootstrap servers and client options (security)
    # run from the app's start on: Faust starts its timers and tasks only once the table is recovered
    early_tasks: tuple[Callable[[], Awaitable[None]], ...] = ()

    async def on_start(self) -> None:
        await super().on_start()
        for task in self.early_tasks:
            self.add_future(task())


def worker_state(app: AppT) -> WorkerState | None:
    """The worker's state, or None for a Faust app that is not the worker's."""
    return app.worker_state if isinstance(app, WorkerApp) else None
