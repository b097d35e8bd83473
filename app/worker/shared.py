"""What the worker's batches tell its consumer's commits: one typed object on the Faust app (I/O shell)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import faust
from aiokafka import TopicPartition
from faust.types import AppT
from mode.utils.objects import cached_property
from mode.utils.queues import FlowControlEvent

from app.metrics import WorkerMetrics
from app.worker.fencing import Membership
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
    # exactly-once: the group membership the offsets of the commit under way were taken in, and the
    # generation of the assignment the decided offsets belong to (None between a revocation and the
    # next assignment; Faust skips both signals while it stops)
    commit_membership: Membership | None = None
    assigned_generation: int | None = None


class FlowControl(FlowControlEvent):
    """Faust's flow control, clearing the stream queues only when the flow comes back from a suspension.

    Faust resumes the flow twice per rebalance: at the start of recovery (the changelogs are read
    through the same queues), and again once the stream partitions are resumed and sought to their
    committed offsets. The second resume cleared the queues too, although the flow had not stopped
    since the first: records the fetcher had handed over in between, of the new generation, were
    dropped while its read offsets had moved past them, and the worker's skip guard restarted the
    worker (exit 5). Records of a revoked partition are cleared when the flow is suspended at the
    revocation (and by this resume after it), and a stream skips an event of another generation.
    """

    def resume(self) -> None:
        suspended = not self.is_active()
        self._suspend.clear()
        self._resume.set()
        if suspended:
            self.clear()


class WorkerApp(faust.App):
    """Faust's app with the worker's state, where the consumer (which Faust creates) finds it."""

    worker_state: WorkerState
    kafka_client: tuple[str, dict[str, Any]]  # the bootstrap servers and client options (security)
    # run from the app's start on: Faust starts its timers and tasks only once the table is recovered
    early_tasks: tuple[Callable[[], Awaitable[None]], ...] = ()
    # exactly-once with a static member id: one transactional producer for every partition, under
    # this id (app/worker/fencing.py); None: one per partition, each under the partition's id
    transactional_id: str | None = None

    @cached_property
    def flow_control(self) -> FlowControlEvent:
        return FlowControl(loop=self.loop)

    async def on_start(self) -> None:
        await super().on_start()
        for task in self.early_tasks:
            self.add_future(task())


def worker_state(app: AppT) -> WorkerState | None:
    """The worker's state, or None for a Faust app that is not the worker's."""
    return app.worker_state if isinstance(app, WorkerApp) else None
