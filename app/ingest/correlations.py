"""pg's correlations: the PUT that maps a deposit to our order (I/O shell); the PostgreSQL store that
decides it is app/ingest/correlation_store.py.

pg's registry line names this module as its ``routes``: the ingest calls :func:`add_routes` when pg is enabled.
"""

from __future__ import annotations

import hmac
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from app.gateways.limits import id_error
from app.ingest.answers import Unavailable, json_response, refusal
from app.ingest.appender import Appender
from app.ingest.body import ENCODED_REASON, OUTCOMES, BodyRefused, encoded, read_body, refuse_body
from app.ingest.correlation_store import CorrelationStore
from app.ingest.deliveries import next_delivery_id
from app.logs import SampledLog
from app.metrics import IngestMetrics
from app.settings import Settings
from topics.catalog import TopicNames
from topics.records import Correlation, correlation_headers

# A correlation is three ids of at most 200 characters: 64 KiB is room for any JSON spelling of
# them, and a bound on what one PUT makes the ingest hold in memory.
MAX_CORRELATION_BODY = 64 * 1024
CORRELATION_FIELDS = ("merchant_reference", "our_order_id", "our_user_id")


def correlation_error(deposit_id: str, body: Any) -> str | None:
    """Why a PUT cannot be a correlation (DESIGN.md §2.4: ids of 1-200 printable characters, no NUL),
    or None. Checked before PostgreSQL, whose index rows and text type refuse such values with a 500."""
    if not isinstance(body, dict):
        return "body must be a JSON object"
    missing = [f for f in CORRELATION_FIELDS if f not in body]
    if missing:
        return f"missing fields: {', '.join(missing)}"
    errors = [id_error("pg_deposit_id", deposit_id), *(id_error(f, body[f]) for f in CORRELATION_FIELDS)]
    return "; ".join(e for e in errors if e) or None


@dataclass(frozen=True)
class Wiring:
    """What a gateway's extra ingest routes are given: the ingest's settings, metrics, store, appender
    and the sampled log its refusals are written to."""

    settings: Settings
    metrics: IngestMetrics
    store: CorrelationStore
    appender: Appender
    topics: TopicNames
    refusals: SampledLog


def add_routes(app: web.Application, wiring: Wiring) -> None:
    route = CorrelationRoute(wiring.settings, wiring.metrics, wiring.store, wiring.appender, wiring.topics,
                             wiring.refusals)
    app.router.add_put("/correlations/pg/deposits/{deposit_id}", route.put)


class CorrelationRoute:
    """PUT /correlations/pg/deposits/{deposit_id}: a bearer token, a checked body, the store's 200/409,
    then the correlation appended to the raw log."""

    def __init__(self, settings: Settings, metrics: IngestMetrics, store: CorrelationStore, appender: Appender,
                 topics: TopicNames, refusals: SampledLog) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store = store
        self.appender = appender
        self.topics = topics
        self.refusals = refusals

    async def put(self, request: web.Request) -> web.StreamResponse:
        metrics = self.metrics
        settings = self.settings
        # Headers arrive decoded with surrogateescape: a non-UTF-8 byte must compare unequal, not raise.
        offered = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(offered, f"Bearer {settings.api_token.reveal()}".encode()):
            metrics.requests.labels("correlations", "unauthorized").inc()
            return refusal(401, "missing or wrong bearer token")
        deposit_id = request.match_info["deposit_id"]
        try:
            if encoded(request.headers):  # as on the webhook route: aiohttp decodes no body (app.py)
                raise BodyRefused(415, ENCODED_REASON)
            raw = await read_body(request, MAX_CORRELATION_BODY, settings.read_timeout_s)
        except BodyRefused as refused:
            metrics.requests.labels("correlations", OUTCOMES[refused.status]).inc()
            return await refuse_body(request, refused)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        error = correlation_error(deposit_id, body)
        if error:
            metrics.requests.labels("correlations", "bad_request").inc()
            return refusal(400, error)
        correlation = Correlation(deposit_id, *(body[f] for f in CORRELATION_FIELDS))
        try:
            if not await self.store.claim(correlation, settings.append_timeout_s):
                metrics.requests.labels("correlations", "conflict").inc()
                return refusal(409, "a different mapping is already stored for this deposit or reference")
            # Into orderly.raw under the deposit's key: its webhooks and its correlation then have one
            # order, the log's, live and in replay (DESIGN.md §4). Appended again on an identical PUT:
            # a retry after a 503 must still reach the log (the worker calls the repeat a duplicate).
            await self.appender.append(
                self.topics.raw, f"pg:{deposit_id}".encode(), correlation.to_bytes(),
                correlation_headers("pg", next_delivery_id(), int(time.time() * 1000)))
        except Unavailable as exc:
            metrics.requests.labels("correlations", "unavailable").inc()
            # the log has the whole message (the operator's side), as the webhook route's 503s (receiver.py)
            self.refusals.log(logging.WARNING, ("correlations", "unavailable"), "503 correlation %s: %s",
                              deposit_id, exc, extra={"gateway": "pg", "outcome": "unavailable"})
            cause = exc.__cause__
            # the internet-facing port: our words and the error's type, never its text (an internal
            # address, a user name), as /readyz here (readiness.public_reason, whose log has the text)
            said = str(exc) if cause is None else f"{str(exc).partition(':')[0]}: {type(cause).__name__}"
            return refusal(503, said)
        metrics.requests.labels("correlations", "stored").inc()
        return json_response(200, status="stored")
