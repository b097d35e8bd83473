"""The worker's Faust app: its hooks into the consumer, producer and tables Faust builds itself,
its raw schema, and typed ways to declare its tasks, timers and signal handlers (seam layer).

Paths and line numbers are of faust-streaming 0.15.3 (app/seams/__init__.py pins it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import faust
from faust.types import TP, AppT
from mode.utils.objects import cached_property
from mode.utils.queues import FlowControlEvent

from app.seams.aiokafka import Membership
from app.seams.mode import FlowControl

if TYPE_CHECKING:  # handover.py reads the app's flow control: imported there, not here
    from app.seams.faust.handover import Handover


class CommittingConsumer(Protocol):
    """What a commit asks of the worker's consumer (consumer.py's Consumer is one: declared here, where the hook
    that takes it is, so that this module need not import consumer.py, which imports it)."""

    in_transaction: bool

    def committed_offsets(self) -> dict[TP, int | None]: ...

    def should_commit(self, tp: TP, offset: int) -> bool: ...

    def assignment(self) -> set[TP]: ...

    def membership(self) -> Membership: ...

    async def faust_commit_offsets(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool: ...


class WorkerHooks(Protocol):
    """What Faust's consumer, transaction manager and table recovery, as the seams build them, ask
    of the worker (app/worker/runtime.py answers)."""

    def decided_offset(self, tp: TP) -> int | None:
        """The offset after the last record of ``tp`` the worker decided: what a commit may cover."""

    def next_commit_wait(self, interval: float) -> float:
        """Right after a commit: the seconds until the next one (``interval``: the commit interval)."""

    def commit_due(self, since_commit: float, wait: float) -> bool:
        """Whether to commit now, ``since_commit`` s after the last commit with ``wait`` chosen for the next."""

    async def commit_offsets(self, consumer: CommittingConsumer, offsets: Mapping[TP, int],
                             start_new_transaction: bool) -> bool:
        """Commit (the consumer's ``faust_commit_offsets`` is Faust's own step of it)."""

    def commit_membership(self) -> Membership | None:
        """The group membership the offsets of the commit under way were taken in."""

    async def settle(self) -> set[str]:
        """At a rebalance: the transactional ids whose open transactions hold writes to be dropped."""

    async def highwaters(self, tps: set[TP], held: Mapping[TP, int | None], *, active: bool,
                         faust_timeout_s: float, title: str) -> dict[TP, int]:
        """Exactly-once: the offset of the last committed record of each changelog partition."""

    def fail(self, message: str, *args: object) -> None:
        """End the worker for its supervisor to restart it, logging ``message % args``."""


class WorkerApp(faust.App):
    """Faust's app with the worker's hooks, where the consumer (which Faust creates) finds them."""

    hooks: WorkerHooks | None = None
    # run from the app's start on: Faust starts its timers and tasks only once the table is recovered
    early_tasks: tuple[Callable[[], Awaitable[None]], ...] = ()
    # exactly-once with a static member id: one transactional producer for every partition, under
    # this id (app/seams/aiokafka.py); None: one per partition, each under the partition's id
    transactional_id: str | None = None
    # the worker's source records, a fetch at a time (handover.py); None: through Faust's stream
    handover: Handover | None = None

    @cached_property
    def flow_control(self) -> FlowControlEvent:
        # faust/app/base.py App.flow_control is a cached_property the conductor and streams read
        return FlowControl(loop=self.loop)

    async def on_start(self) -> None:
        await super().on_start()
        for task in self.early_tasks:
            self.add_future(task())

    # Faust's decorators and signals are untyped: declared here, typed, once.
    def run_task(self, task: Callable[[], Awaitable[None]]) -> None:
        self.task(task)

    def run_timer(self, interval: float, timer: Callable[[], Awaitable[None]]) -> None:
        self.timer(interval=interval)(timer)

    def on_assigned(self, handler: Callable[[set[TP]], Awaitable[None]]) -> None:
        async def receiver(app: Any, assigned: set[TP], **kwargs: Any) -> None:
            await handler(assigned)
        self.on_partitions_assigned.connect(receiver)  # type: ignore[arg-type]  # typed for its generic sender

    def on_revoked(self, handler: Callable[[set[TP]], Awaitable[None]]) -> None:
        async def receiver(app: Any, revoked: set[TP], **kwargs: Any) -> None:
            await handler(revoked)
        self.on_partitions_revoked.connect(receiver)  # type: ignore[arg-type]  # as above

    def serve_bytes(self, path: str, render: Callable[[], tuple[bytes, str]]) -> None:
        """Serve ``render()``'s body and content type at ``path`` on Faust's web port."""
        async def page(web_view: Any, request: Any) -> Any:
            body, content_type = render()
            return web_view.bytes(body, content_type=content_type.split(";")[0])
        self.page(path)(page)

    def on_stopping(self, handler: Callable[[], Awaitable[None]]) -> None:
        async def receiver(app: Any, **kwargs: Any) -> None:
            await handler()
        self.on_before_shutdown.connect(receiver)  # type: ignore[arg-type]  # as above


def hooks_of(app: AppT) -> WorkerHooks | None:
    """The worker's hooks, or None for a Faust app that is not the worker's."""
    hooks: WorkerHooks | None = getattr(app, "hooks", None)
    return hooks


def worker_transactional_id(app: AppT) -> str | None:
    """The transactional id of a worker that writes every partition in one transaction (see
    app/seams/aiokafka.py), or None: a transaction per partition."""
    found: str | None = getattr(app, "transactional_id", None)
    return found


class RawSchema(faust.Schema):  # type: ignore[type-arg]  # Faust's Schema is generic in key and value types
    """orderly.raw's records as they are: bytes keys, values and headers, decoded by no codec.
    Faust's compiled decode (faust/serializers/schemas.py Schema.compile) runs each through its
    serializer registry ("raw" returns the bytes) and looks up the Event class in its settings, per record."""

    def compile(self, app: faust.types.AppT, **_: Any) -> Any:
        async def decode(message: Any, *, propagate: bool = False) -> faust.Event:
            return faust.Event(app, message.key, message.value, message.headers, message)

        return decode


def raw_schema() -> RawSchema:
    return RawSchema(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
