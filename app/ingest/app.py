"""The ingest's aiohttp application, its wiring and the `orderly ingest` process that serves it (I/O shell)."""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any

from aiohttp import web

from app.gateways import registry
from app.ingest.appender import Appender
from app.ingest.body import MAX_BODY
from app.ingest.correlation_store import CorrelationStore
from app.ingest.correlations import Wiring
from app.ingest.readiness import Readiness, healthz
from app.ingest.receiver import Receiver
from app.kafka_client import client_options
from app.logs import SampledLog
from app.metrics import IngestMetrics, serve_metrics
from app.process_setup import dump_tasks_on_usr1
from app.settings import Settings
from app.webhook_http import WebhookSite
from topics.catalog import names

log = logging.getLogger("orderly.ingest")

APPENDER: web.AppKey[Appender] = web.AppKey("appender")
CORRELATIONS: web.AppKey[CorrelationStore] = web.AppKey("correlations")
METRICS: web.AppKey[IngestMetrics] = web.AppKey("metrics", IngestMetrics)
REFUSALS: web.AppKey[SampledLog] = web.AppKey("refusals", SampledLog)
RECEIVER: web.AppKey[Receiver] = web.AppKey("receiver")
# 401s, quarantined bodies and 503s are logged with their reason, at most this many lines per gateway
# and reason a minute (then one line with the count of the rest): a flood cannot fill the disk.
REFUSALS_LOGGED_PER_MINUTE = 5


def validate_secrets(settings: Settings) -> None:
    """Refuse to start with a secret its gateway's scheme cannot use (card's: not a Standard Webhooks key)."""
    for name, secrets in settings.secrets.items():
        gateway = registry.find(name)
        if gateway is not None and gateway.check_secret is not None:
            for secret in secrets.reveal():
                gateway.check_secret(secret)


def add_gateway_routes(app: web.Application, wiring: Wiring) -> None:
    """The enabled gateways' other routes (pg's correlations): a disabled gateway's are not served (404)."""
    for name in wiring.settings.gateways:
        gateway = registry.find(name)
        if gateway is not None and gateway.routes is not None:
            importlib.import_module(gateway.routes).add_routes(app, wiring)


def create_app(settings: Settings) -> web.Application:
    validate_secrets(settings)
    app = web.Application(client_max_size=MAX_BODY)
    metrics = IngestMetrics()
    app[METRICS] = metrics
    topics = names(settings.namespace)  # once, not per request
    app[APPENDER] = Appender(settings.kafka_bootstrap, settings.append_timeout_s, metrics,
                             **client_options(settings))
    app[CORRELATIONS] = CorrelationStore(settings.postgres_dsn.reveal(), settings.namespace, metrics)
    app[REFUSALS] = SampledLog(log, first=REFUSALS_LOGGED_PER_MINUTE, window_s=60.0,
                               on_suppressed=lambda key: metrics.log_suppressed.labels(log.name).inc())
    app[RECEIVER] = Receiver(settings, metrics, app[APPENDER], app[REFUSALS], topics)
    app.router.add_post("/webhooks/{gateway}", app[RECEIVER].receive)
    add_gateway_routes(app, Wiring(settings, metrics, app[CORRELATIONS], app[APPENDER], topics, app[REFUSALS]))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", Readiness(app[APPENDER], app[CORRELATIONS], topics.raw).readyz)
    # No /metrics here: the webhook port serves webhooks, correlations and health only (DESIGN.md §3);
    # metrics are served on ORDERLY_METRICS_HOST:ORDERLY_METRICS_PORT, as by every other process.

    async def report_suppressed() -> None:
        while True:
            await asyncio.sleep(5)
            app[REFUSALS].flush()

    async def lifecycle(app: web.Application) -> Any:
        runner = (await serve_metrics(metrics.registry, settings.metrics_port, settings.metrics_host)
                  if settings.metrics_port else None)
        reporting = asyncio.create_task(report_suppressed())
        await app[APPENDER].start()
        yield
        reporting.cancel()
        await app[APPENDER].stop()
        await app[CORRELATIONS].close()
        if runner is not None:
            await runner.cleanup()

    app.cleanup_ctx.append(lifecycle)
    return app


# aiohttp's protocol never decodes a body: one with a Content-Encoding is refused 415 by the receiver
# before it is read (app/ingest/body.py), and aiohttp's own decoder would otherwise answer some codings
# (br without Brotli, a deflate body that is not) 400 itself, with a traceback in the log per request.
PROTOCOL_OPTIONS = {"auto_decompress": False}


def server_options(settings: Settings) -> dict[str, Any]:
    """aiohttp's per-connection limits. Its keep-alive timer also runs from the moment a connection
    opens until its first request's headers are complete, so it bounds a slow header sender
    (slowloris) as the read timeout bounds a slow body."""
    return {"keepalive_timeout": settings.read_timeout_s, **PROTOCOL_OPTIONS}


def webhook_site(runner: web.AppRunner, host: str, port: int, app: web.Application) -> WebhookSite:
    """The listening site of `orderly ingest`: the webhook fast path in front of aiohttp's protocol."""
    receiver = app[RECEIVER]
    return WebhookSite(runner, host, port, receive=receiver.webhook,
                       gateways=frozenset(name for name in registry.GATEWAYS if receiver.serves(name)),
                       max_body=MAX_BODY, keepalive_s=receiver.settings.read_timeout_s,
                       on_hand_over=app[METRICS].handed_over.inc)


async def serve(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT, then stop listening, finish the answers in flight, clean up."""
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, handle_signals=True, **server_options(settings))
    await runner.setup()
    dump_tasks_on_usr1()
    try:
        await webhook_site(runner, settings.ingest_host, settings.ingest_port, app).start()
        log.info("ingest listening on http://%s:%d", settings.ingest_host, settings.ingest_port)
        await asyncio.Event().wait()  # until a signal raises GracefulExit out of the loop
    finally:
        await runner.cleanup()


def run(settings: Settings) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    main = loop.create_task(serve(settings))
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        main.cancel()  # its finally cleans up: the sites, the answers in flight, the producer
        loop.run_until_complete(asyncio.gather(main, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
