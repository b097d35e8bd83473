"""pg's correlations: the PUT that maps a deposit to our order and the PostgreSQL store deciding it (I/O shell).

pg's registry line names this module as its ``routes``: the ingest calls :func:`add_routes` when pg is enabled.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson
from aiohttp import web

from app import pg_pool
from app.gateways.limits import id_error
from app.ingest.answers import Unavailable, json_response, refusal
from app.ingest.appender import Appender
from app.ingest.body import ENCODED_REASON, OUTCOMES, BodyRefused, encoded, read_body, refuse_body
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


CLAIMS_AT_ONCE = 256  # claims decided in one statement at most
_COLUMNS = "pg_deposit_id, merchant_reference, our_order_id, our_user_id"
# One statement for a batch: a row whose deposit or reference is stored already, or comes earlier in
# the same batch, is skipped (ON CONFLICT DO NOTHING skips a conflict within the statement too).
INSERT_CLAIMS = (f"INSERT INTO pg_deposit_correlations ({_COLUMNS}) "
                 "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) "
                 f"ON CONFLICT DO NOTHING RETURNING {_COLUMNS}")
# A statement of its own, after the insert: in READ COMMITTED it sees a row another connection
# committed while the insert waited for it, which the insert's own snapshot would not.
STORED_CLAIMS = f"SELECT {_COLUMNS} FROM pg_deposit_correlations WHERE pg_deposit_id = ANY($1::text[])"
UNREACHABLE_HERE = (OSError, TimeoutError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
                    asyncpg.InterfaceError)
Claimed = tuple[str, str, str, str]  # a correlation's fields, in the table's column order


def _fields(c: Correlation) -> Claimed:
    return c.pg_deposit_id, c.merchant_reference, c.our_order_id, c.our_user_id


class CorrelationStore:
    """Decides 200/409 for correlation PUTs atomically in PostgreSQL (unique on both ids).

    The claims that arrive while a batch is being decided are decided together next, in one INSERT of
    them all and, for those not inserted, one SELECT (a group commit): a statement per PUT cost the
    ingest and PostgreSQL more than the rest of the PUT. A claim is decided as it would be alone: new
    or identical to what is stored, or conflicting (another mapping for its deposit, or its reference
    stored for another deposit, earlier in the batch included)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._pool: asyncpg.Pool | None = None
        self._creating: asyncio.Future[asyncpg.Pool] | None = None
        self._waiting: list[tuple[Correlation, asyncio.Future[bool], float]] = []
        self._deciding: asyncio.Task[None] | None = None

    async def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            # One creation shared by concurrent first callers (two would each open a pool and leak
            # one), shielded so that a caller's deadline does not cancel it half-way.
            if self._creating is None:
                self._creating = asyncio.ensure_future(self._create_pool())
            creating = self._creating
            try:
                self._pool = await asyncio.shield(creating)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                raise Unavailable(f"postgres unreachable: {exc}") from exc
            finally:
                if creating.done():
                    self._creating = None
        return self._pool

    async def _create_pool(self) -> asyncpg.Pool:
        return await pg_pool.create_pool(self.dsn, self.schema, min_size=1, max_size=4, timeout=3)

    async def claim(self, c: Correlation, timeout_s: float) -> bool:
        """True if the mapping is new or identical; False if it conflicts with a stored one.
        Unavailable when PostgreSQL does not decide it within ``timeout_s``."""
        decided: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((c, decided, timeout_s))
        if self._deciding is None or self._deciding.done():
            self._deciding = asyncio.create_task(self._decide_waiting())
        try:
            async with asyncio.timeout(timeout_s):  # cancels ``decided``: its batch leaves it out
                return await decided
        except TimeoutError as exc:
            raise Unavailable(f"postgres unavailable: TimeoutError {exc}") from exc

    async def _decide_waiting(self) -> None:
        """Decide the waiting claims, a batch at a time, until none waits."""
        while self._waiting:
            batch, self._waiting = self._waiting[:CLAIMS_AT_ONCE], self._waiting[CLAIMS_AT_ONCE:]
            batch = [waiting for waiting in batch if not waiting[1].done()]  # its caller gave up
            if not batch:
                continue
            claims = [c for c, _, _ in batch]
            results: list[bool | Exception]
            try:
                try:
                    results = [*await self._decide(claims, min(t for _, _, t in batch))]
                except Unavailable:
                    raise
                except Exception:
                    if len(claims) == 1:
                        raise
                    # a claim PostgreSQL refuses fails alone, not the batch it came with
                    results = [await self._decided_alone(c, t) for c, _, t in batch]
            except Exception as exc:  # each caller raises it (or a copy: Unavailable)
                for _, decided, _ in batch:
                    if not decided.done():
                        decided.set_exception(_copy(exc))
                continue
            for (_, decided, _), result in zip(batch, results, strict=True):
                if not decided.done():
                    if isinstance(result, BaseException):
                        decided.set_exception(result)
                    else:
                        decided.set_result(result)

    async def _decided_alone(self, c: Correlation, timeout_s: float) -> bool | Exception:
        try:
            return (await self._decide([c], timeout_s))[0]
        except Exception as exc:  # this claim's caller raises it
            return exc

    async def _decide(self, claims: list[Correlation], timeout_s: float) -> list[bool]:
        pool = await self.pool()
        fields = [_fields(c) for c in claims]
        try:
            async with asyncio.timeout(timeout_s), pool.acquire() as conn:
                inserted = {tuple(r) for r in await conn.fetch(INSERT_CLAIMS, *map(list, zip(*fields, strict=True)))}
                rest = [f[0] for f in fields if f not in inserted]
                stored = {r[0]: tuple(r) for r in await conn.fetch(STORED_CLAIMS, rest)} if rest else {}
        except UNREACHABLE_HERE as exc:
            raise Unavailable(f"postgres unavailable: {type(exc).__name__} {exc}") from exc
        # no row for a deposit: its merchant_reference belongs to another deposit
        return [f in inserted or stored.get(f[0]) == f for f in fields]

    async def probe(self) -> None:
        """SELECT 1 now, on a pooled connection (no new connection per probe)."""
        pool = await self.pool()
        if await pool.fetchval("SELECT 1") != 1:
            raise Unavailable("postgres answered SELECT 1 wrongly")

    async def close(self) -> None:
        if self._deciding is not None:
            self._deciding.cancel()
        if self._pool is not None:
            await self._pool.close()


def _copy(exc: Exception) -> Exception:
    """``exc`` for one more caller to raise: an Unavailable of its own, with the same cause (the
    route answers from it), not one instance whose traceback every caller would extend."""
    if isinstance(exc, Unavailable):
        copy = Unavailable(str(exc))
        copy.__cause__ = exc.__cause__
        return copy
    return exc


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
