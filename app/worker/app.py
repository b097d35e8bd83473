"""`orderly worker`: the Faust app, its agent, timers and signal handlers, and how it runs (I/O shell).

One agent consumes ``orderly.raw`` (webhooks, synced fetches and the merchant's correlations, each
under its resource's key, so the instance that owns a partition sees every record about its
resources in the log's one order, live and in replay) and keeps each resource's state in a
changelogged Faust table. What a batch does is batch.py's; when offsets are committed,
consumer.py's; exactly-once's transactions, transactions.py's.

With ``processing_guarantee=exactly_once`` a batch's outputs and changelog are staged and go into
its source partition's Kafka transaction, with the consumed offsets, when Faust commits it: Faust
itself would commit only the changelog and the offsets, and send an agent's other records outside
the transaction (tests/integration/test_faust_recovery.py shows a re-publish after kill -9).

The table is written the way Faust writes it (changelog record, then the local store, then the
store's changelog offset), but a batch at a time: one aiokafka batch per changelog partition instead
of Faust's per-key send, callback and offset write.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable
from typing import Any

import faust
from aiokafka import TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka

from app import logs
from app.core.pacing import busy_pause
from app.kafka_client import client_options, faust_credentials
from app.liveness import Liveness
from app.metrics import WorkerMetrics
from app.producer import KeyedProducer
from app.settings import Settings
from app.worker import fencing
from app.worker.batch import BatchProcessor
from app.worker.consumer import (
    _Consumer,
    _coordinator,
    consumer_of,
    fetch_min_bytes,
    flow_state,
    member_id,
    membership_failure,
    quiet_after,
)
from app.worker.exits import FAILED_EXIT_CODE, STALLED_EXIT_CODE, dump_tasks, exit_for_restart
from app.worker.recovery import WorkerTableManager
from app.worker.shared import WorkerApp, WorkerState
from app.worker.store import ROCKSDB_OPTIONS, TABLE
from app.worker.takes import decide_takes
from app.worker.transactions import _Producer, _TransactionManager
from topics.admin import topic_configs
from topics.catalog import DERIVED_RECORD_BYTES, REQUEST_BYTES, names

log = logging.getLogger("orderly.worker")
LAG_EVERY_S = 5.0  # how often the group's consumer lag is read for /metrics
MEMBERSHIP_EVERY_S = 1.0  # how often the worker checks that its consumer is still a member of its group
BATCH_WITHIN_S = 0.02  # a batch waits at most this for more records: part of the latency at low load
# Under load, batches are let grow (app/core/pacing.py): after a batch of BUSY_BATCH records or more,
# the next one is taken no sooner than Settings.worker_busy_interval_s after it, unless a full batch
# (Settings.worker_batch_max) is already waiting (a backlog). Each batch costs a produce request per
# output topic-partition, so fewer, larger batches carry more records per second; at low load
# batches stay small and nothing waits.


class _RawSchema(faust.Schema):  # type: ignore[type-arg]  # Faust's Schema is generic in key and value types
    """orderly.raw's records as they are: bytes keys, values and headers, decoded by no codec.
    Faust's compiled decode runs each through its serializer registry ("raw" returns the bytes)
    and looks up the Event class in its settings, per record."""

    def compile(self, app: faust.types.AppT, **_: Any) -> Any:
        async def decode(message: Any, *, propagate: bool = False) -> faust.Event:
            return faust.Event(app, message.key, message.value, message.headers, message)

        return decode


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer
    Producer = _Producer
    TransactionManager = _TransactionManager


def queued(stream: faust.StreamT[Any]) -> int:
    """Records Faust has fetched for the stream and not yet passed to its take."""
    return int(stream.channel.queue.qsize())  # type: ignore[attr-defined]  # StreamT types it a bare AsyncIterator


def build_app(settings: Settings, max_record_bytes: int | None = None) -> WorkerApp:
    """``max_record_bytes``: the largest record the outputs may be; None: read from the topics'
    configuration as the worker starts (record_limit)."""
    n = names(settings.namespace)
    datadir = settings.data_dir / f"{settings.namespace}-worker"
    datadir.mkdir(parents=True, exist_ok=True)  # Faust creates only the last level
    app = WorkerApp(
        f"{settings.namespace}-worker",
        broker=f"kafka://{settings.kafka_bootstrap}",
        broker_credentials=faust_credentials(settings),  # its consumer, producers and admin calls
        store="rocksdb://" if settings.store == "rocksdb" else "memory://",
        processing_guarantee=settings.processing_guarantee,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        datadir=str(datadir),
        web_enabled=bool(settings.metrics_port),
        web_bind=settings.metrics_host,
        web_port=settings.metrics_port or 6066,
        # The port serves /metrics and nothing else: Faust's table pages would serve resource
        # state (the admin's job, behind its token) and its router pages the group's topology.
        web_tables_enabled=False,
        web_router_enabled=False,
        web_stats_enabled=False,
        web_graph_enabled=False,
        # recovery without Faust's fixed waits, ending on the last committed changelog record
        TableManager=WorkerTableManager,
        # static membership: a worker restarted under its id gets its partitions back at once
        consumer_group_instance_id=settings.worker_member,
        broker_session_timeout=10,
        broker_heartbeat_interval=1,
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",  # values are JSON bytes made by orjson, not Faust's codecs
        # A changelog write per resource per batch goes to one of up to `partitions` transactional
        # producers; lingering lets each send a batch instead of a request per record.
        producer_linger=0.005,
        broker_commit_interval=settings.worker_commit_interval_s,
        producer_max_batch_size=256 * 1024,
        # every record a worker writes or reads fits (DESIGN.md §2.4): a changelog value holds a
        # resource's state with its parked events, up to app/core/dispatch.py's limit
        producer_max_request_size=REQUEST_BYTES,
        consumer_max_fetch_size=REQUEST_BYTES,
    )
    app.transport = _Transport(app.conf.broker_consumer, app)
    app.kafka_client = (settings.kafka_bootstrap, client_options(settings))  # for the recovery's reads
    metrics = WorkerMetrics()
    state = app.worker_state = WorkerState(metrics, busy_commit_interval=settings.worker_busy_commit_interval_s,
                                           quiet_s=quiet_after(settings.worker_busy_interval_s))
    source = app.topic(n.raw, schema=_RawSchema(key_type=bytes, value_type=bytes,
                                                 key_serializer="raw", value_serializer="raw"))
    table = app.Table(TABLE, partitions=settings.partitions, key_type=bytes, value_type=bytes,
                      extra_topic_configs={"max.message.bytes": str(DERIVED_RECORD_BYTES),
                                           "min.insync.replicas": str(settings.min_insync)},
                      options=ROCKSDB_OPTIONS if settings.store == "rocksdb" else None)
    # send_all hands over whole batches
    producer = KeyedProducer(settings.kafka_bootstrap, linger_ms=0, **client_options(settings))
    liveness = Liveness(settings.kafka_bootstrap, f"{settings.namespace}-worker", settings.worker_stall_s,
                        **client_options(settings))
    batches = BatchProcessor(app, state, table, n, producer, liveness, max_record_bytes or DERIVED_RECORD_BYTES)
    if settings.processing_guarantee == "exactly_once":
        state.stage = batches.stage
        # KIP-447 (app/worker/fencing.py): a transaction's offsets carry the group generation they
        # were taken in (a worker that lost its partitions cannot commit them) and a new owner reads
        # committed offsets and changelogs only once no transaction holds them. In both models, so
        # that workers of the two in one group (a member id added or removed) fence each other.
        fencing.install()
        fencing.register(app.conf.id)
        if settings.worker_member:
            # One transaction per commit for every partition, under the worker's own transactional
            # id: restarted under its member id, the worker ends its old transaction.
            app.transactional_id = f"{app.conf.id}-worker-{settings.worker_member}"
            log.info("exactly-once: one transaction per commit for all partitions, transactional id %s",
                     app.transactional_id)

    @app.task  # type: ignore[untyped-decorator]  # Faust's decorators are untyped
    async def on_start() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)

    @app.agent(source)
    async def process(stream: faust.StreamT[bytes]) -> None:
        # read while the group is joined and the table recovered (the agent starts before either),
        # not before the app starts: it would add a Kafka round trip to every restart
        limit = asyncio.ensure_future(record_limit(settings)) if max_record_bytes is None else None
        await producer.start()  # here, not in a task: the agent may receive records before tasks run
        if limit is not None:
            batches.max_record_bytes = await checked_limit(limit)
        # Events are acked by hand, only once their outputs are acknowledged and the table written:
        # take_events() would ack a batch whose processing raised or was cancelled half-way.
        # noack_take is Faust's Stream's, missing from its StreamT interface.
        batch_max = settings.worker_batch_max

        async def decide(events: list[Any]) -> None:
            taken = state.last_batch_at = time.monotonic()
            await batches.handle(events)
            for event in events:
                await stream.ack(event)
            waiting = queued(stream)
            consumer_of(app).set_fetch_min_bytes(fetch_min_bytes(len(events)))
            state.last_batch_at = time.monotonic()  # a long batch is not a quiet time
            pause = busy_pause(len(events), waiting, taken, state.last_batch_at, settings.worker_busy_interval_s,
                               batch_max)
            if pause:
                await asyncio.sleep(pause)  # under load: let the next batch grow

        def may_hold() -> bool:  # not while the flow stops: no next take may come then
            return not (app.should_stop or getattr(app, "rebalancing", False) or not app.flow_control.is_active())

        await decide_takes(stream.noack_take(batch_max, within=BATCH_WITHIN_S),  # type: ignore[attr-defined]
                           decide, lambda: queued(stream), may_hold, batch_max)

    async def watch_membership() -> None:
        """From the start on (before any assignment, which a worker outside its group never gets)."""
        while not app.should_stop:
            await asyncio.sleep(MEMBERSHIP_EVERY_S)
            failure = membership_failure(app)
            if failure is not None:
                # seen when a second worker joined under the same static id: the group handed it
                # the first one's assignment, which Faust's assignor refuses
                same_id = (f"; a second worker with ORDERLY_WORKER_INSTANCE_ID={settings.worker_member} in "
                           "the group ends it this way: each worker needs an id of its own"
                           if settings.worker_instance_id else "")
                exit_for_restart(FAILED_EXIT_CODE, "this worker's membership of its consumer group ended (%r), so "
                                 "it is given no partitions%s: exiting so that the supervisor restarts it",
                                 failure, same_id)

    app.early_tasks = (watch_membership,)

    @app.timer(interval=5.0)  # type: ignore[untyped-decorator]  # Faust's decorators are untyped
    async def watchdog() -> None:
        if app.in_recovery or getattr(app, "rebalancing", False):  # restoring a large table takes as long as it takes
            liveness.last_progress = time.monotonic()
            return
        behind = await liveness.stalled()
        if behind:
            waiting = ", ".join(f"{tp.topic}[{tp.partition}]: {count}" for tp, count in sorted(behind.items()))
            log.warning("stalled: %s", flow_state(app, n.raw))
            dump_tasks()  # where it waited, for the report of a stall that a restart only hides
            exit_for_restart(STALLED_EXIT_CODE, "no batch decided for %.0f s while records wait (%s): exiting so "
                             "that the supervisor restarts this worker (state and offsets are recovered from "
                             "Kafka)", liveness.quiet_for(), waiting)

    @app.timer(interval=LAG_EVERY_S)  # type: ignore[untyped-decorator]  # Faust's decorators are untyped
    async def export_lag() -> None:
        """orderly_consumer_lag of the worker's group, during recovery too (when it matters most)."""
        try:
            lag = await asyncio.wait_for(liveness.group_lag(n.raw), LAG_EVERY_S)
            metrics.consumer_lag.labels(liveness.group_id, n.raw).set(lag)
        except Exception as exc:  # Kafka away: the gauge keeps its last value, the timer tries again
            log.info("consumer lag not read: %r", exc)

    if settings.metrics_port:
        @app.page("/metrics")
        async def metrics_page(web_view: Any, request: Any) -> Any:
            body, content_type = metrics.render()
            return web_view.bytes(body, content_type=content_type.split(";")[0])

    joined_as: list[str] = []

    def check_membership(app: faust.App) -> None:
        """A static member keeps its member id from join to join; a new one means the coordinator
        forgot it: another worker joined under the same static id, or this one was away past the
        session timeout. Both times another process may have decided its partitions meanwhile;
        a restart starts again from the committed offsets and state."""
        member = member_id(app)
        if member and joined_as and member != joined_as[0]:
            exit_for_restart(FAILED_EXIT_CODE, "this worker joined its consumer group again as a new member, so its "
                             "group forgot it: another worker with ORDERLY_WORKER_INSTANCE_ID=%s took its place (each "
                             "worker needs an id of its own), or it was away past the %d s session timeout; exiting "
                             "so that the supervisor restarts it", settings.worker_member,
                             app.conf.broker_session_timeout)
        if member and not joined_as:
            joined_as.append(member)

    # Faust types its signals' receivers as taking its generic sender, not an App.
    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def log_assignment(app: faust.App, assigned: set[Any], **kwargs: Any) -> None:
        if settings.worker_instance_id:
            check_membership(app)
        mine = sorted(tp.partition for tp in assigned if tp.topic == n.raw)
        liveness.on_assigned({TopicPartition(tp.topic, tp.partition) for tp in assigned
                              if tp.topic == n.raw})
        batches.assigned(assigned)
        if state.stage is not None:  # the generation whose partitions the decided offsets are of
            state.assigned_generation = fencing.coordinator_membership(_coordinator(app)).generation
        metrics.partitions.set(len(mine))
        log.info("Assigned partitions: %d of %s: %s", len(mine), n.raw, mine)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # as above
    async def drop_revoked(app: faust.App, revoked: set[Any], **kwargs: Any) -> None:
        batches.revoked({tp.partition for tp in revoked if tp.topic == n.raw})
        state.assigned_generation = None

    @app.on_before_shutdown.connect  # type: ignore[arg-type]  # as above
    async def stop_producer(app: faust.App, **kwargs: Any) -> None:
        await producer.stop()
        await liveness.close()

    return app


class QuietWorker(faust.Worker):
    """Faust's worker sets the root logger to DEBUG so that every log record turns its terminal
    spinner; then every debug call in Faust and mode builds a LogRecord, a noticeable share of the
    worker's CPU. No spinner: the root logger keeps the configured level."""

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        self.spinner = None
        logger.setLevel(level or logging.WARNING)

    async def _sentinel_task(self) -> None:
        """mode runs this last, after its services stopped and their tasks were gathered, before it
        closes the loop; its own sleeps a second, which every stop (and so every restart) waited."""
        await asyncio.sleep(0)


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


def run(settings: Settings) -> None:
    app = build_app(settings)
    # Faust replaces the root logger's handlers at start: with ours (app/logs.py), so that its lines
    # are in ORDERLY_LOG_FORMAT too
    level = logging.getLevelNamesMapping()[settings.faust_loglevel.upper()]
    worker = QuietWorker(app, loglevel=settings.faust_loglevel, quiet=True,
                         logging_config=logs.logging_config(settings.log_format, level))
    worker.execute_from_commandline()
