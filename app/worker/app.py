"""`orderly worker`: the Faust app, its agent, timers and signal handlers, and how it runs (I/O shell).

One agent consumes ``orderly.raw`` (webhooks, synced fetches and the merchant's correlations, each
under its resource's key, so the instance that owns a partition sees every record about its
resources in the log's one order, live and in replay) and keeps each resource's state in a
changelogged Faust table. ``build_app`` only wires the parts: what a batch does is batch.py's;
the handlers of rebalances, membership, lag and stalls, runtime.py's; a commit's steps, commit.py's;
exactly-once's staged writes, transactions.py's; what Faust itself is made to do, app/seams/faust/.

With ``processing_guarantee=exactly_once`` a batch's outputs and changelog are staged and go into
its source partition's Kafka transaction, with the consumed offsets, when Faust commits it: Faust
itself would commit only the changelog and the offsets, and send an agent's other records outside
the transaction (tests/integration/test_faust_recovery.py shows a re-publish after kill -9).

The table is written the way Faust writes it (changelog record, then the local store, then the
store's changelog offset), but a batch at a time: one aiokafka batch per changelog partition instead
of Faust's per-key send, callback and offset write.
"""

from __future__ import annotations

import logging

import faust

from app import logs
from app.kafka_client import client_options, faust_credentials
from app.liveness import Liveness
from app.metrics import WorkerMetrics
from app.producer import KeyedProducer
from app.seams import aiokafka as kafka_seam
from app.seams.faust import Handover, Transport, WorkerApp, WorkerTableManager, raw_schema
from app.seams.mode import QuietWorker
from app.settings import WORKER_REQUEST_TIMEOUT_S, Settings
from app.worker.batch import BatchProcessor
from app.worker.consumer import quiet_after
from app.worker.runtime import LAG_EVERY_S, WATCHDOG_EVERY_S, WorkerRuntime
from app.worker.shared import WorkerState
from app.worker.store import ROCKSDB_OPTIONS, TABLE
from app.worker.takeover import worker_transaction
from topics.catalog import DERIVED_RECORD_BYTES, REQUEST_BYTES, names

log = logging.getLogger("orderly.worker")


def build_app(settings: Settings, max_record_bytes: int | None = None) -> WorkerApp:
    """The worker's Faust app, its parts wired. ``max_record_bytes``: the largest record the outputs
    may be; None: read from the topics' configuration as the worker starts (runtime.record_limit)."""
    n = names(settings.namespace)
    app = faust_app(settings)
    state = WorkerState(WorkerMetrics(), busy_commit_interval=settings.worker_busy_commit_interval_s,
                        quiet_s=quiet_after(settings.worker_busy_interval_s))
    source = app.topic(n.raw, schema=raw_schema())
    app.handover = Handover(app, n.raw)
    table = resource_table(app, settings)
    # send_all hands over whole batches
    producer = KeyedProducer(settings.kafka_bootstrap, linger_ms=0, **client_options(settings))
    liveness = Liveness(settings.kafka_bootstrap, f"{settings.namespace}-worker", settings.worker_stall_s,
                        **client_options(settings))
    batches = BatchProcessor(app, state, table, n, producer, liveness, max_record_bytes or DERIVED_RECORD_BYTES)
    if settings.processing_guarantee == "exactly_once":
        exactly_once(app, settings, state, batches)
    runtime = app.hooks = WorkerRuntime(app, settings, state, batches, producer, liveness, max_record_bytes)
    app.run_task(runtime.on_start)

    @app.agent(source)
    async def process(stream: faust.StreamT[bytes]) -> None:  # a function: Faust names the agent after it
        await runtime.process(stream)

    app.early_tasks = (runtime.take_signals, runtime.watch_membership, runtime.watch_loop)
    app.run_timer(WATCHDOG_EVERY_S, runtime.watchdog)
    app.run_timer(LAG_EVERY_S, runtime.export_lag)
    if settings.metrics_port:
        app.serve_bytes("/metrics", state.metrics.render)
    app.on_assigned(runtime.on_assigned)
    app.on_revoked(runtime.on_revoked)
    app.on_stopping(runtime.on_stopping)
    return app


def faust_app(settings: Settings) -> WorkerApp:
    """The Faust app of the worker, configured: its transport, store, web port and table manager."""
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
        # a worker lost for good (kill -9, its machine gone) holds its partitions this long
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.heartbeat_interval_s,
        broker_request_timeout=WORKER_REQUEST_TIMEOUT_S,
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
    app.transport = Transport(app.conf.broker_consumer, app)
    return app


def resource_table(app: WorkerApp, settings: Settings) -> faust.types.TableT[bytes, bytes]:
    """Each resource's state, changelogged: every value fits a record of the catalog's limit."""
    return app.Table(TABLE, partitions=settings.partitions, key_type=bytes, value_type=bytes,
                     extra_topic_configs={"max.message.bytes": str(DERIVED_RECORD_BYTES),
                                          "min.insync.replicas": str(settings.min_insync)},
                     options=ROCKSDB_OPTIONS if settings.store == "rocksdb" else None)


def exactly_once(app: WorkerApp, settings: Settings, state: WorkerState, batches: BatchProcessor) -> None:
    """With exactly-once a batch's writes are staged for their transaction, and the offsets fenced."""
    state.stage = batches.stage
    # KIP-447 (app/seams/aiokafka.py): a transaction's offsets carry the group generation they
    # were taken in (a worker that lost its partitions cannot commit them) and a new owner reads
    # committed offsets and changelogs only once no transaction holds them. In both models, so
    # that workers of the two in one group (a member id added or removed) fence each other.
    kafka_seam.install()
    kafka_seam.register(app.conf.id)
    if settings.worker_member:
        # One transaction per commit for every partition, under the worker's own transactional
        # id: restarted under its member id, the worker ends its old transaction.
        app.transactional_id = worker_transaction(app.conf.id, settings.worker_member)
        log.info("exactly-once: one transaction per commit for all partitions, transactional id %s",
                 app.transactional_id)


def run(settings: Settings) -> None:
    app = build_app(settings)
    # Faust replaces the root logger's handlers at start: with ours (app/logs.py), so that its lines
    # are in ORDERLY_LOG_FORMAT too
    level = logging.getLevelNamesMapping()[settings.faust_loglevel.upper()]
    worker = QuietWorker(app, loglevel=settings.faust_loglevel, quiet=True,
                         logging_config=logs.logging_config(settings.log_format, level))
    worker.execute_from_commandline()
