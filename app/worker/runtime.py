"""The running worker: its agent's loop, its rebalance, membership, lag and stall handlers, and the
answers to what Faust's consumer, producer and tables ask of it (I/O shell).

app.py builds one ``WorkerRuntime`` and wires its methods into the Faust app; the seams
(app/seams/faust/) call its ``WorkerHooks`` methods from inside Faust.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping
from typing import Any

import faust
from aiokafka import TopicPartition
from faust.types import TP

from app.core.pacing import busy_pause
from app.group_session import session_refusal
from app.kafka_client import client_options
from app.liveness import Liveness
from app.process_setup import dump_tasks, dump_tasks_on_usr1
from app.producer import KeyedProducer
from app.seams import aiokafka as kafka_seam
from app.seams.faust import (
    CommittingConsumer,
    Consumer,
    WorkerApp,
    consumer_of,
    transactional_id,
)
from app.settings import Settings
from app.waits import within
from app.worker.batch import BatchProcessor
from app.worker.commit import Commit
from app.worker.consumer import commit_due, fetch_min_bytes
from app.worker.exits import FAILED_EXIT_CODE, STALLED_EXIT_CODE, exit_for_restart
from app.worker.peers import PeerWatch
from app.worker.recovery import exact_highwaters
from app.worker.shared import WorkerState
from app.worker.takeover import Takeover
from app.worker.takes import decide_takes
from topics.admin import topic_configs
from topics.catalog import DERIVED_RECORD_BYTES, names

log = logging.getLogger("orderly.worker")
LAG_EVERY_S = 5.0  # how often the group's consumer lag is read for /metrics
MEMBERSHIP_EVERY_S = 1.0  # how often the worker checks that its consumer is still a member of its group
WATCHDOG_EVERY_S = 5.0  # how often the stall watchdog looks
LOOP_TICK_S = 0.05  # the event-loop watch's sleep: a wake-up that late by more was held up by a stall
LOOP_REPORT_EVERY_S = 10.0  # how often the longest stall is logged
CONFIGURATION_EXIT_CODE = 2  # as app/cli.py's configuration errors: a restart alone will not help
BATCH_WITHIN_S = 0.02  # a batch waits at most this for more records: part of the latency at low load
# Under load, batches are let grow (app/core/pacing.py): after a batch of BUSY_BATCH records or more,
# the next one is taken no sooner than Settings.worker_busy_interval_s after it, unless a full batch
# (Settings.worker_batch_max) is already waiting (a backlog). Each batch costs a produce request per
# output topic-partition, so fewer, larger batches carry more records per second; at low load
# batches stay small and nothing waits.


class WorkerRuntime:
    """One worker process's running parts, their shared state as attributes."""

    def __init__(self, app: WorkerApp, settings: Settings, state: WorkerState, batches: BatchProcessor,
                 producer: KeyedProducer, liveness: Liveness, max_record_bytes: int | None) -> None:
        self.app = app
        self.settings = settings
        self.state = state
        self.metrics = state.metrics
        self.batches = batches
        self.producer = producer
        self.liveness = liveness
        self.max_record_bytes = max_record_bytes  # None: read from the topics' configuration at the start
        self.raw = names(settings.namespace).raw
        if app.handover is None:
            raise ValueError("the worker's app has no handover for its source topic")
        self.handover = app.handover
        self.commit = Commit(state, one_transaction=app.transactional_id is not None)
        self.joined_as: str | None = None  # the member id of the first join (static membership)
        # exactly-once with a static id: a lost worker's open transaction aborted at once (takeover.py)
        self.takeover = (Takeover(settings, app.conf.id, settings.worker_member)
                         if app.transactional_id is not None and settings.worker_member else None)
        self.taking_over: asyncio.Future[set[str]] | None = None
        self.faust_consumer: Consumer | None = None  # taken on the app's loop at its start
        # the other workers watched, a lost one removed from the group before its session ends (peers.py)
        self.peers = (PeerWatch(settings, app.conf.id, names(settings.namespace).workers, self.aiokafka_consumer,
                                lambda result: self.metrics.peers_removed.labels(result).inc())
                      if settings.worker_lost_after_s > 0 else None)

    # --- the agent ---

    async def take_signals(self) -> None:
        """kill -USR1 logs where the tasks wait, from the app's start on (an early task): a worker
        stuck joining its group or recovering its table is when it is needed."""
        dump_tasks_on_usr1()

    async def on_start(self) -> None:
        if self.takeover is not None:
            self.takeover.start()
        if self.peers is not None:
            self.faust_consumer = self.consumer()  # here, on the app's loop: Faust makes it on first use
            self.peers.start()

    def aiokafka_consumer(self) -> Any:
        """aiokafka's consumer under Faust's (None before it exists): read by the peers' thread for the
        member id it publishes and the rejoin after a removal (both thread-safe: app/seams/aiokafka.py)."""
        return None if self.faust_consumer is None else self.faust_consumer.client()

    async def process(self, stream: faust.StreamT[bytes]) -> None:
        # The stream is not read: its topic's records come a fetch at a time (app/seams/faust/handover.py)
        self.handover.subscribe(stream.channel)
        # read while the group is joined and the table recovered (the agent starts before either),
        # not before the app starts: it would add a Kafka round trip to every restart
        limit = asyncio.ensure_future(record_limit(self.settings)) if self.max_record_bytes is None else None
        refused = asyncio.ensure_future(session_refusal(self.settings)) if limit is not None else None
        await self.producer.start()  # here, not in a task: the agent may receive records before tasks run
        if limit is not None:
            self.batches.max_record_bytes = await checked_limit(limit)
        if refused is not None and (reason := await refused) is not None:
            exit_for_restart(CONFIGURATION_EXIT_CODE, "%s", reason)
        # Events are acked by hand, only once their outputs are acknowledged and the table written:
        # take_events() would ack a batch whose processing raised or was cancelled half-way.
        batch_max = self.settings.worker_batch_max

        handover = self.handover
        await decide_takes(handover.takes(batch_max, within=BATCH_WITHIN_S), self.decide, handover.queued,
                           self.may_hold, batch_max)

    async def decide(self, events: list[Any]) -> None:
        state = self.state
        taken = state.last_batch_at = time.monotonic()
        await self.batches.handle(events)
        self.handover.ack(events)
        waiting = self.handover.queued()
        self.consumer().set_fetch_min_bytes(fetch_min_bytes(len(events)))
        state.last_batch_at = time.monotonic()  # a long batch is not a quiet time
        pause = busy_pause(len(events), waiting, taken, state.last_batch_at, self.settings.worker_busy_interval_s,
                           self.settings.worker_batch_max)
        if pause:
            await asyncio.sleep(pause)  # under load: let the next batch grow

    def may_hold(self) -> bool:
        """Not while the flow stops: no next take may come then."""
        app = self.app
        return not (app.should_stop or getattr(app, "rebalancing", False) or not app.flow_control.is_active())

    def consumer(self) -> Consumer:
        return consumer_of(self.app)

    # --- rebalances ---

    async def on_assigned(self, assigned: set[TP]) -> None:
        if self.settings.worker_instance_id:
            self.check_membership()
        if self.takeover is not None and (self.taking_over is None or self.taking_over.done()):
            self.taking_over = asyncio.ensure_future(self.takeover.after_assignment())  # reads go on meanwhile
        mine = sorted(tp.partition for tp in assigned if tp.topic == self.raw)
        self.liveness.on_assigned({TopicPartition(tp.topic, tp.partition) for tp in assigned if tp.topic == self.raw})
        self.batches.assigned(assigned)
        if self.state.stage is not None:  # the generation whose partitions the decided offsets are of
            self.state.assigned_generation = self.consumer().membership().generation
        self.metrics.partitions.set(len(mine))
        log.info("Assigned partitions: %d of %s: %s", len(mine), self.raw, mine)

    async def on_revoked(self, revoked: set[TP]) -> None:
        self.batches.revoked({tp.partition for tp in revoked if tp.topic == self.raw})
        self.state.assigned_generation = None

    async def on_stopping(self) -> None:
        if self.peers is not None:
            await asyncio.to_thread(self.peers.stop)
        if self.takeover is not None:
            await self.takeover.close()
        await self.producer.stop()
        await self.liveness.close()

    # --- membership ---

    def check_membership(self) -> None:
        """A static member keeps its member id from join to join; a new one means the coordinator
        forgot it: another worker joined under the same static id, or this one was away past the
        session timeout. Both times another process may have decided its partitions meanwhile;
        a restart starts again from the committed offsets and state."""
        member = kafka_seam.member_id(self.consumer().client())
        if member and self.joined_as is not None and member != self.joined_as:
            exit_for_restart(FAILED_EXIT_CODE, "this worker joined its consumer group again as a new member, so its "
                             "group forgot it: another worker with ORDERLY_WORKER_INSTANCE_ID=%s took its place (each "
                             "worker needs an id of its own), or it was away past the %g s session timeout or "
                             "silent past ORDERLY_WORKER_LOST_AFTER_MS (the other workers removed it); exiting "
                             "so that the supervisor restarts it", self.settings.worker_member,
                             self.app.conf.broker_session_timeout)
        if member and self.joined_as is None:
            self.joined_as = member

    async def watch_membership(self) -> None:
        """From the start on (before any assignment, which a worker outside its group never gets)."""
        while not self.app.should_stop:
            await asyncio.sleep(MEMBERSHIP_EVERY_S)
            failure = kafka_seam.coordination_failure(self.consumer().client())
            if failure is not None:
                # seen when a second worker joined under the same static id: the group handed it
                # the first one's assignment, which Faust's assignor refuses
                same_id = (f"; a second worker with ORDERLY_WORKER_INSTANCE_ID={self.settings.worker_member} in "
                           "the group ends it this way: each worker needs an id of its own"
                           if self.settings.worker_instance_id else "")
                exit_for_restart(FAILED_EXIT_CODE, "this worker's membership of its consumer group ended (%r), so "
                                 "it is given no partitions%s: exiting so that the supervisor restarts it",
                                 failure, same_id)

    async def watch_loop(self) -> None:
        """Logs the event loop's longest stall every LOOP_REPORT_EVERY_S. aiokafka's heartbeats are a
        task on this loop: a stall delays them, and one near the session (ORDERLY_SESSION_TIMEOUT_MS)
        has the group expel this worker (a warning from a third of it on). The figures under load
        are what the session's default was chosen from (docs/production.md)."""
        session = self.settings.session_timeout_s
        longest, since = 0.0, time.monotonic()
        while not self.app.should_stop:
            before = time.monotonic()
            await asyncio.sleep(LOOP_TICK_S)
            now = time.monotonic()
            longest = max(longest, now - before - LOOP_TICK_S)
            if now - since >= LOOP_REPORT_EVERY_S:
                log.log(logging.WARNING if longest > session / 3 else logging.INFO,
                        "event loop: longest stall %.3f s in the last %.0f s (the group's session: %g s)",
                        longest, now - since, session)
                longest, since = 0.0, now

    # --- lag and stalls ---

    async def watchdog(self) -> None:
        # restoring a large table takes as long as it takes
        if self.app.in_recovery or getattr(self.app, "rebalancing", False):
            self.liveness.last_progress = time.monotonic()
            return
        behind = await self.liveness.stalled()
        if behind:
            waiting = ", ".join(f"{tp.topic}[{tp.partition}]: {count}" for tp, count in sorted(behind.items()))
            log.warning("stalled: %s", self.consumer().flow_state(self.raw))
            dump_tasks()  # where it waited, for the report of a stall that a restart only hides
            exit_for_restart(STALLED_EXIT_CODE, "no batch decided for %.0f s while records wait (%s): exiting so "
                             "that the supervisor restarts this worker (state and offsets are recovered from "
                             "Kafka)", self.liveness.quiet_for(), waiting)

    async def export_lag(self) -> None:
        """orderly_consumer_lag of the worker's group, during recovery too (when it matters most)."""
        try:
            lag = await within(self.liveness.group_lag(self.raw), LAG_EVERY_S)
            self.metrics.consumer_lag.labels(self.liveness.group_id, self.raw).set(lag)
        except Exception as exc:  # Kafka away: the gauge keeps its last value, the timer tries again
            log.info("consumer lag not read: %r", exc)

    # --- WorkerHooks: what the seams ask from inside Faust ---

    def decided_offset(self, tp: TP) -> int | None:
        return self.state.decided.get(tp)

    def next_commit_wait(self, interval: float) -> float:
        return self.commit.next_wait(interval)

    def commit_due(self, since_commit: float, wait: float) -> bool:
        return commit_due(since_commit, wait, time.monotonic() - self.state.last_batch_at, self.state.quiet_s)

    async def commit_offsets(self, consumer: CommittingConsumer, offsets: Mapping[TP, int],
                             start_new_transaction: bool) -> bool:
        return await self.commit.run(consumer, offsets, start_new_transaction)

    def commit_membership(self) -> kafka_seam.Membership | None:
        return self.state.commit_membership

    async def settle(self) -> set[str]:
        stage = self.state.stage
        if stage is None:
            return set()
        dirty = await stage.settle()
        return {transactional_id(self.app, stage.topic, partition) for partition in dirty}

    async def highwaters(self, tps: set[TP], held: Mapping[TP, int | None], *, active: bool,
                         faust_timeout_s: float, title: str) -> dict[TP, int]:
        return await exact_highwaters(self.settings.kafka_bootstrap, client_options(self.settings), tps, held,
                                      active=active, faust_timeout_s=faust_timeout_s, title=title)

    def fail(self, message: str, *args: object) -> None:
        exit_for_restart(FAILED_EXIT_CODE, message, *args)


async def record_limit(settings: Settings) -> int:
    """The largest record every topic the worker writes accepts (an installation's topics may have
    been created with a smaller max.message.bytes than today's catalog)."""
    n = names(settings.namespace)
    written = [n.state, n.decisions, n.facts, n.effects, n.changelog]  # quarantine: raw bodies, as raw takes them
    configs = await topic_configs(settings.kafka_bootstrap, written, **client_options(settings))
    return min(int(configs.get(topic, {}).get("max.message.bytes") or DERIVED_RECORD_BYTES) for topic in written)


async def checked_limit(reading: Awaitable[int]) -> int:
    try:
        limit = await reading
    except Exception as exc:  # Kafka away or refusing: as any other start that cannot reach it
        exit_for_restart(FAILED_EXIT_CODE, "the configuration of the topics the worker writes could not be read "
                         "(%r): exiting so that the supervisor restarts it", exc)
    if limit < DERIVED_RECORD_BYTES:
        log.warning("a topic the worker writes takes records of at most %d bytes (the catalog sets %d): records "
                    "whose outputs pass half of that are set aside; raise max.message.bytes to lift it",
                    limit, DERIVED_RECORD_BYTES)
    return limit
