"""Prometheus metrics of each process, in a registry of its own (so tests can run many apps)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from app.process_setup import dump_tasks
from app.readiness import Readiness
from app.waits import within

log = logging.getLogger("orderly.metrics")
APPEND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 30.0, 300.0, 3600.0)


def _installed() -> str:
    try:
        return version("orderly")
    except PackageNotFoundError:
        return "unknown"


class _Metrics:
    """One process's metrics in a registry of its own, with the process's own CPU, memory, start
    time (restarts: ``changes(process_start_time_seconds[1h])``), Python's collector and platform,
    and ``orderly_process_info{process}`` naming which Orderly process it is."""

    PROCESS = "orderly"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        Gauge("orderly_process_info", "Which Orderly process serves these metrics (always 1)", ["process", "version"],
              registry=self.registry).labels(self.PROCESS, _installed()).set(1)

    def child(self, metric: Counter | Histogram | Gauge, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: prometheus_client validates the labels and
        takes a lock on every ``labels()`` call, a few µs each on a path that runs per request."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def set_aside_counter(self) -> Counter:
        """Records a stage could not handle and set aside to orderly.quarantine (DESIGN.md §2.4)."""
        return Counter("orderly_set_aside", "Records a stage set aside to orderly.quarantine instead of "
                       "stopping on them", ["stage", "gateway"], registry=self.registry)

    def consumer_lag_gauge(self) -> Gauge:
        """One name in every consuming process and the admin, so that one alert covers them all."""
        return Gauge("orderly_consumer_lag", "Records not yet consumed, by consumer group and topic (the worker's "
                     "and fetcher's Kafka groups; the sinks' positions stored in PostgreSQL)", ["group", "topic"],
                     registry=self.registry)


class IngestMetrics(_Metrics):
    PROCESS = "ingest"

    def __init__(self) -> None:
        super().__init__()
        self.requests = Counter(
            "orderly_ingest_requests", "Requests by gateway and outcome "
            "(stored, quarantined, unauthorized, too_large, unavailable, not_found, bad_request, conflict)",
            ["gateway", "outcome"], registry=self.registry)
        self.signature_failures = Counter(
            "orderly_ingest_signature_failures", "Deliveries refused with 401", ["gateway"],
            registry=self.registry)
        self.quarantined = Counter(
            "orderly_ingest_quarantined", "Validly signed bodies sent to quarantine", ["gateway", "reason"],
            registry=self.registry)
        self.append_seconds = Histogram(
            "orderly_ingest_append_seconds", "Time from send to Kafka acknowledgement (acks=all)",
            ["topic"], buckets=APPEND_BUCKETS, registry=self.registry)
        self.append_failures = Counter(
            "orderly_ingest_append_failures", "Appends that failed or passed the deadline (answered 503)",
            ["topic"], registry=self.registry)
        self.log_suppressed = Counter(
            "orderly_log_lines_suppressed", "Sampled log lines not written (the first few per gateway and "
            "reason a minute are)", ["logger"], registry=self.registry)
        self.correlation_batches = Counter(
            "orderly_ingest_correlation_batches", "Batches of correlation claims by outcome: decided, again (decided "
            "after a deadlock), alone (a claim's values refused: each claim then decided as a batch of one, counted "
            "too), refused (such a claim), unavailable (503 for each claim); busy counts claims, not batches: each "
            "refused at once, too many waiting", ["outcome"], registry=self.registry)
        for outcome in ("decided", "again", "alone", "refused", "unavailable", "busy"):
            self.correlation_batches.labels(outcome)
        self.correlation_batch_size = Histogram(
            "orderly_ingest_correlation_batch_size", "Correlation claims decided in one statement",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=self.registry)
        self.correlations_waiting = Gauge(
            "orderly_ingest_correlations_waiting", "Correlation claims waiting for their batch", registry=self.registry)
        self.handed_over = Counter(
            "orderly_ingest_connections_handed_over", "Connections the webhook fast path gave to aiohttp's "
            "HTTP protocol (another route, a body still arriving, chunked, Expect, HTTP/1.0, ...)",
            registry=self.registry)


class WorkerMetrics(_Metrics):
    PROCESS = "worker"

    def __init__(self) -> None:
        super().__init__()
        self.decisions = Counter("orderly_worker_decisions", "Deliveries decided, by gateway and outcome",
                                 ["gateway", "outcome"], registry=self.registry)
        self.effects = Counter("orderly_worker_effects", "Effects emitted by applied transitions",
                               ["gateway", "type"], registry=self.registry)
        self.errors = Counter("orderly_worker_errors", "Decisions carrying an error (e.g. claim_id collision)",
                              ["gateway"], registry=self.registry)
        self.batch_seconds = Histogram("orderly_worker_batch_seconds", "Time to decide and emit one batch",
                                       buckets=APPEND_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("orderly_worker_batch_size", "Records per batch",
                                    buckets=(1, 10, 50, 100, 250, 500, 1000), registry=self.registry)
        self.partitions = Gauge("orderly_worker_partitions", "orderly.raw partitions this worker owns",
                                registry=self.registry)
        self.commit_seconds = Histogram("orderly_worker_commit_seconds",
                                        "One commit of the consumed offsets (exactly-once: with the "
                                        "transactions' outputs and changelog)",
                                        buckets=APPEND_BUCKETS, registry=self.registry)
        self.commit_wait = Gauge("orderly_worker_commit_wait_seconds",
                                 "The wait before the next commit, chosen from the records the last one "
                                 "covered (ORDERLY_COMMIT_INTERVAL_S or ORDERLY_BUSY_COMMIT_INTERVAL_S)",
                                 registry=self.registry)
        self.set_aside = self.set_aside_counter()
        self.consumer_lag = self.consumer_lag_gauge()
        self.log_suppressed = Counter(
            "orderly_log_lines_suppressed", "Sampled log lines not written (the first few per gateway and "
            "reason a minute are)", ["logger"], registry=self.registry)
        self.handed_again = Counter("orderly_worker_records_handed_again",
                                    "Records Faust handed over again after a seek (acked, not decided twice)",
                                    registry=self.registry)
        self.peers_removed = Counter("orderly_worker_peers_removed",
                                     "Workers silent past ORDERLY_WORKER_LOST_AFTER_MS that this one removed from "
                                     "the group, by result (removed, not_a_member, failed)", ["result"],
                                     registry=self.registry)
        for result in ("removed", "not_a_member", "failed"):  # at 0 from the start: increase() sees the first
            self.peers_removed.labels(result)
        self.rewinds = Counter("orderly_worker_partition_rewinds",
                               "Partitions fetched again from records Faust never handed over (a skip mended)",
                               registry=self.registry)


class ProjectorMetrics(_Metrics):
    PROCESS = "projector"

    def __init__(self) -> None:
        super().__init__()
        self.projected = Counter("orderly_projector_decisions", "Decisions written to PostgreSQL",
                                 registry=self.registry)
        self.set_aside = self.set_aside_counter()
        self.errors = Counter("orderly_projector_errors", "Errors surfaced to projection_errors",
                              registry=self.registry)
        self.batch_seconds = Histogram("orderly_projector_batch_seconds", "One batch transaction",
                                       buckets=APPEND_BUCKETS, registry=self.registry)
        self.gaps_open = Gauge("orderly_pg_sequence_gaps_open", "Open gaps in pg's event sequence",
                               registry=self.registry)
        self.sequences_missing = Gauge("orderly_pg_sequence_missing", "Sequence numbers not seen yet (pg)",
                                       registry=self.registry)
        self.lag_seconds = Histogram("orderly_projector_lag_seconds",
                                     "From the ingest's received_at to the decision's read-model write",
                                     buckets=LAG_BUCKETS, registry=self.registry)
        self.backfills = Counter("orderly_pg_backfill_requests", "Gaps older than the limit sent to orderly.fetch",
                                 registry=self.registry)
        self.consumer_lag = self.consumer_lag_gauge()
        self.parked_resources = Gauge("orderly_parked_resources", "Resources holding at least one parked delivery "
                                      "(read from PostgreSQL every few seconds)", ["gateway"], registry=self.registry)
        self.parked_events = Gauge("orderly_parked_events", "Parked deliveries", ["gateway"], registry=self.registry)
        self.parked_oldest_s = Gauge("orderly_parked_oldest_seconds", "Age of the oldest delivery still parked "
                                     "(0 when none)", ["gateway"], registry=self.registry)
        self.parked_overdue = Gauge("orderly_parked_overdue_resources", "Resources whose oldest parked delivery "
                                    "waited longer than ORDERLY_PARKED_ALERT_AFTER_S", ["gateway"],
                                    registry=self.registry)
        self.quarantine_records = Gauge("orderly_quarantine_records", "Records in the quarantine table not "
                                        "redriven, by the stage that set them aside", ["stage"],
                                        registry=self.registry)


def metrics_app(registry: CollectorRegistry, readiness: Readiness | None = None) -> web.Application:
    """/metrics over ``registry``; with ``readiness``, /readyz beside it (app/readiness.py). Apart
    from serving it, so that the Helm chart's probes are held to its routes (tests/served_routes.py)."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    if readiness is not None:
        async def readyz(request: web.Request) -> web.Response:
            status, body = readiness.answer()
            return web.json_response(body, status=status)

        app.router.add_get("/readyz", readyz)
    return app


async def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1",
                        readiness: Readiness | None = None) -> web.AppRunner:
    """A /metrics endpoint of its own (ORDERLY_METRICS_HOST:ORDERLY_METRICS_PORT), apart from any port a
    process serves its clients on; with ``readiness``, /readyz beside it (app/readiness.py)."""
    runner = web.AppRunner(metrics_app(registry, readiness), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def start_service(started: contextlib.AsyncExitStack, service: Service, registry: CollectorRegistry,
                        port: int | None, host: str, readiness: Readiness | None = None) -> None:
    """Start a process's ``service`` and its /metrics endpoint (when ``port``), each stopped by
    ``started`` in reverse order however the run ends: a SIGTERM during the start included, so a
    consumer that joined its group leaves it (app/process_setup.until_terminated)."""
    started.push_async_callback(service.stop)
    await service.start()
    if port:
        runner = await serve_metrics(registry, port, host, readiness)
        started.push_async_callback(runner.cleanup)


CLEANUP_GRACE_S = 10.0  # how long a cancelled task beside the main loop may clean up (a consumer leaving its group)
CANCEL_AGAIN_S = 1.0


def beside(started: contextlib.AsyncExitStack, task: Awaitable[object]) -> asyncio.Future[object]:
    """Run ``task`` beside the process's main loop until ``started`` closes, then cancel it and wait
    until it cleaned up. One still running CLEANUP_GRACE_S later lost the cancellation (code that
    catches it, or Python 3.11's ``asyncio.wait_for``: app/waits.py): where every task waits is
    logged, and it is cancelled again every CANCEL_AGAIN_S, so that it cannot hold the stop for ever.
    Returns the task: a caller that cannot go on without it watches it."""
    running = asyncio.ensure_future(task)

    async def cancelled() -> None:
        running.cancel()
        await asyncio.wait({running}, timeout=CLEANUP_GRACE_S)
        if not running.done():
            log.warning("a task beside the main loop still runs %.0f s after its cancellation: cancelling it "
                        "again", CLEANUP_GRACE_S)
            dump_tasks()
        while not running.done():
            running.cancel()
            await asyncio.wait({running}, timeout=CANCEL_AGAIN_S)
        if not running.cancelled() and running.exception() is not None:
            log.info("a task beside the main loop ended with %r", running.exception())

    started.push_async_callback(cancelled)
    return running


async def every(interval_s: float, read: Callable[[], Awaitable[object]], what: str) -> None:
    """Run ``read`` every ``interval_s`` for ever, as a task of its own beside a process's main loop:
    a read that fails or takes longer than the interval (Kafka or a broker away) is logged and the
    gauges keep their last values, and the main loop never waits for a metric."""
    while True:
        try:
            await within(read(), interval_s)
        except Exception as exc:  # whatever it was, the next reading tries again
            log.info("%s not read: %r", what, exc)
        await asyncio.sleep(interval_s)


class EffectsMetrics(_Metrics):
    PROCESS = "effects"

    def __init__(self) -> None:
        super().__init__()
        self.recorded = Counter("orderly_effects_recorded", "Effect records consumed (duplicates included)",
                                registry=self.registry)
        self.set_aside = self.set_aside_counter()
        self.delivered = Counter("orderly_effects_delivered", "Effects delivered (2xx)", ["type"],
                                 registry=self.registry)
        self.failures = Counter("orderly_effects_delivery_failures", "Failed delivery attempts", ["type"],
                                registry=self.registry)
        self.dead = Counter("orderly_effects_dead", "Effects given up after the last attempt", registry=self.registry)
        self.in_flight = Gauge("orderly_effects_in_flight", "Delivery requests in flight (staying at "
                               "orderly_effects_concurrency: the merchant is the bottleneck)", registry=self.registry)
        self.concurrency = Gauge("orderly_effects_concurrency", "ORDERLY_EFFECTS_CONCURRENCY, the most requests "
                                 "in flight", registry=self.registry)
        self.delivering = Gauge("orderly_effects_delivering", "1 when effects are delivered (ORDERLY_EFFECTS_URL "
                                "set), 0 when they are only recorded", registry=self.registry)
        self.request_seconds = Histogram("orderly_effects_request_seconds",
                                         "One delivery request, until the merchant's answer or the timeout",
                                         buckets=(*APPEND_BUCKETS, 10.0), registry=self.registry)
        self.pending = Gauge("orderly_effects_pending", "Effects neither delivered nor dead (read every few "
                             "seconds)", registry=self.registry)
        self.oldest_pending_s = Gauge("orderly_effects_oldest_pending_seconds",
                                      "Age of the oldest effect neither delivered nor dead", registry=self.registry)
        self.dead_records = Gauge("orderly_effects_dead_records", "Effects dead and never delivered (read with "
                                  "orderly_effects_pending)", registry=self.registry)
        self.consumer_lag = self.consumer_lag_gauge()


class FetcherMetrics(_Metrics):
    PROCESS = "fetcher"

    def __init__(self) -> None:
        super().__init__()
        self.fetches = Counter("orderly_fetcher_fetches", "Gateway API fetches by outcome "
                               "(synced, not_found, error, unusable)", ["gateway", "outcome"], registry=self.registry)
        self.set_aside = self.set_aside_counter()
        self.passes = Counter("orderly_fetcher_passes", "Passes over the parked resources of the gateways "
                              "that fetch (every ORDERLY_FETCH_INTERVAL_S)", registry=self.registry)
        self.backing_off = Gauge("orderly_fetcher_card_backing_off", "Parked card payments not asked again yet: "
                                 "the gateway's last answers were the same (the wait doubles, up to an hour)",
                                 registry=self.registry)
        self.reappended = Counter("orderly_sweeper_reappended", "Stored records with no decision after "
                                  "ORDERLY_SWEEP_AFTER_S, appended again", ["topic"], registry=self.registry)
        self.consumer_lag = self.consumer_lag_gauge()


class AdminMetrics(_Metrics):
    PROCESS = "admin"

    def __init__(self) -> None:
        super().__init__()
        self.requests = Counter("orderly_admin_requests", "Admin API and console requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.actions = Counter("orderly_admin_actions", "Operator actions by action and result (done, refused)",
                               ["action", "result"], registry=self.registry)
        self.login_failures = Counter("orderly_admin_login_failures",
                                      "Console logins and API requests refused for a wrong or missing token",
                                      ["via"], registry=self.registry)
        self.consumer_lag = self.consumer_lag_gauge()
        self.overview_count_seconds = Gauge(
            "orderly_admin_overview_count_seconds",
            "How long the overview's last count took (it reads every delivery; app/admin/overview.py)",
            registry=self.registry)
        self.overview_count_failures = Counter(
            "orderly_admin_overview_count_failures", "Overview counts that failed (tried again after a back-off)",
            registry=self.registry)
