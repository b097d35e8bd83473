"""`orderly effects`: records every effect once in PostgreSQL, then delivers it (I/O shell).

Recording: ``orderly.effects`` → ``effects`` rows (``ON CONFLICT (dedupe_key) DO NOTHING``) with the
consumed offsets in the same transaction, so an effect emitted twice upstream is one row.
Delivering (DESIGN.md §3.2): rows are claimed in a short transaction (a lease, ``FOR UPDATE SKIP
LOCKED``), as many as there are free delivery slots, and each is POSTed to ``ORDERLY_EFFECTS_URL``
with no transaction open, signed the Standard Webhooks way (app/signing.py) and with the dedupe key
as ``Idempotency-Key`` and ``webhook-id``; then marked delivered, or rescheduled with a jittered
backoff and marked dead after the last attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from aiokafka.structs import ConsumerRecord

from app.kafka_client import client_options
from app.metrics import EffectsMetrics, beside, every, start_service
from app.producer import KeyedProducer
from app.readiness import RETRY_S, UNREACHABLE, Readiness, wait_for_postgres
from app.setting_kinds import SettingsError
from app.settings import Settings
from app.signing import signed_headers, signing_key
from app.sink import PgSink
from projections import quarantine
from projections.bulk import Conn, printable, unnest_insert, write
from topics.catalog import names
from topics.records import EFFECTS as EFFECT_RECORDS

log = logging.getLogger("orderly.effects")
CLAIM_BATCH = 200
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 300.0
PENDING_EVERY_S = 5.0  # how often the backlog gauges are read from PostgreSQL
STOP_GRACE_S = 5.0  # deliveries in flight at stop get this long to finish and be marked
# Of a refusing merchant's answer, this much is read and kept in last_error (the rest is never read:
# an endless answer costs one bounded read, within the request's ORDERLY_EFFECTS_TIMEOUT_S).
ANSWER_BYTES = 300

EFFECTS = unnest_insert("effects", "dedupe_key text, type text, gateway text, resource_id text, payload text::jsonb, "
                        "caused_by text", "ON CONFLICT (dedupe_key) DO NOTHING")
CLAIM_DUE = """
UPDATE effects SET next_attempt_at = now() + make_interval(secs => $2)
 WHERE dedupe_key IN (SELECT dedupe_key FROM effects
                       WHERE delivered_at IS NULL AND dead_at IS NULL AND next_attempt_at <= now()
                       ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING dedupe_key, type, gateway, resource_id, payload, caused_by, attempts"""
MARK_DELIVERED = """
UPDATE effects SET delivered_at = now(), attempts = attempts + 1, last_error = NULL WHERE dedupe_key = $1"""
MARK_FAILED = """
UPDATE effects SET attempts = attempts + 1, last_error = $2,
       next_attempt_at = now() + make_interval(secs => $3),
       dead_at = CASE WHEN attempts + 1 >= $4 THEN now() END
 WHERE dedupe_key = $1"""
PENDING = """
SELECT count(*) AS pending, coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_s,
       (SELECT count(*) FROM effects WHERE dead_at IS NOT NULL AND delivered_at IS NULL) AS dead
  FROM effects WHERE delivered_at IS NULL AND dead_at IS NULL"""


def backoff_ceiling_s(attempts: int) -> float:
    """The longest delay after ``attempts`` failures: 0.5 s doubling, capped at 5 min."""
    return min(BACKOFF_BASE_S * 2.0 ** min(max(attempts - 1, 0), 32), BACKOFF_CAP_S)


def backoff_s(attempts: int, draw: float) -> float:
    """Delay before the next attempt after ``attempts`` failures, ``draw`` uniform in [0, 1]: half
    the ceiling fixed, the other half jittered ("equal jitter"). The fixed half keeps a failing
    merchant from being retried at once; the jitter spreads the retries of the effects that failed
    together in an outage, so they do not all come back in the same instant."""
    half = backoff_ceiling_s(attempts) / 2
    return half + half * min(max(draw, 0.0), 1.0)


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_https(variable: str, url: str, purpose: str, allow_http: tuple[str, bool]) -> None:
    """``url`` is https, or http to a loopback address, or http allowed by the setting
    ``allow_http`` (its name, its value): what travels there is signed or carries a key. Raises
    SettingsError naming ``variable``; ``purpose`` says what goes over it."""
    parts = urlsplit(url)
    if not parts.hostname or parts.scheme not in ("https", "http"):
        raise SettingsError(f"{variable}: not an http(s) URL with a host: {url!r}")
    if parts.scheme == "http" and not (is_loopback(parts.hostname) or allow_http[1]):
        raise SettingsError(f"{variable} is http:// to a host that is not a loopback address: {purpose} over https "
                            f"(or set {allow_http[0]}=true for a network you trust, e.g. a sidecar)")


def check_url(settings: Settings) -> None:
    """https, or http to a loopback address (or with ORDERLY_EFFECTS_ALLOW_HTTP): each request carries
    a signed body about money and the Idempotency-Key a replayed copy would be taken under."""
    assert settings.effects_url is not None
    require_https("ORDERLY_EFFECTS_URL", settings.effects_url, "effects are delivered",
                  ("ORDERLY_EFFECTS_ALLOW_HTTP", settings.effects_allow_http))


def delivery_key(settings: Settings) -> bytes | None:
    """The signing key when effects are delivered; never an unsigned delivery (DESIGN.md §3.2), nor
    one in the clear across a network (:func:`check_url`)."""
    if settings.effects_url is None:
        return None
    if not settings.effects_secret:
        raise SettingsError("ORDERLY_EFFECTS_URL is set but ORDERLY_EFFECTS_SECRET is not: effects are only "
                            "delivered signed; set ORDERLY_EFFECTS_SECRET=whsec_<base64 key> (the secret the "
                            "merchant verifies with), or unset ORDERLY_EFFECTS_URL to record without delivering")
    check_url(settings)
    if settings.effects_timeout_s >= settings.effects_lease_s:
        raise SettingsError(f"ORDERLY_EFFECTS_TIMEOUT_S={settings.effects_timeout_s:g} is not shorter than "
                            f"ORDERLY_EFFECTS_LEASE_S={settings.effects_lease_s:g}: a request still open when its "
                            "lease ends would be claimed and sent again; lower the timeout or lengthen the lease")
    try:
        return signing_key(settings.effects_secret.reveal())
    except ValueError as exc:
        raise SettingsError(f"ORDERLY_EFFECTS_SECRET: {exc}") from None


def request_body(row: Any) -> bytes:
    return orjson.dumps({"dedupe_key": row["dedupe_key"], "type": row["type"], "gateway": row["gateway"],
                         "resource_id": row["resource_id"], "payload": orjson.loads(row["payload"]),
                         "caused_by": row["caused_by"]})


async def refusal(resp: aiohttp.ClientResponse) -> str:
    """A failed attempt's reason: the status, where a redirect pointed, and the answer's first bytes."""
    if 300 <= resp.status < 400:
        return f"HTTP {resp.status}: a redirect (to {resp.headers.get('Location', '?')[:200]!r}), not followed"
    try:
        head = await resp.content.read(ANSWER_BYTES)
    except (aiohttp.ClientError, TimeoutError):
        head = b""
    text = head.decode("utf-8", "replace").strip()
    return f"HTTP {resp.status}: {text}" if text else f"HTTP {resp.status}"


async def record(conn: Conn, messages: list[ConsumerRecord]) -> None:
    effects = [EFFECT_RECORDS.decode(m.value) for m in messages]
    await write(conn, EFFECTS, [
        (e.dedupe_key, e.type, e.gateway, e.resource_id, orjson.dumps(e.payload).decode(), e.caused_by)
        for e in effects])


class EffectsWorker:
    def __init__(self, settings: Settings, deliver: bool = True, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.deliver = deliver and settings.effects_url is not None
        self.key = delivery_key(settings) if self.deliver else None
        self.rng = rng or random.Random()
        self.metrics = EffectsMetrics()
        self.metrics.concurrency.set(settings.effects_concurrency)
        self.metrics.delivering.set(1 if self.deliver else 0)
        self.sink = PgSink(settings, "effects", names(settings.namespace).effects, self._record,
                           set_aside=self._set_aside)
        self.producer = KeyedProducer(settings.kafka_bootstrap, **client_options(settings))
        self.http: aiohttp.ClientSession | None = None
        # The bound on requests in flight, across every claim of this process (DESIGN.md §3.2).
        self.slots = asyncio.Semaphore(settings.effects_concurrency)
        self.in_flight: set[asyncio.Task[None]] = set()
        self.delivering: set[str] = set()  # dedupe keys of the deliveries in flight, their marks included
        self.failed: BaseException | None = None  # a delivery task's own failure: fatal
        self.readiness = Readiness()

    async def _record(self, conn: Conn, messages: list[ConsumerRecord]) -> None:
        await record(conn, messages)
        self.metrics.recorded.inc(len(messages))

    async def _set_aside(self, message: ConsumerRecord, reason: str) -> None:
        record = quarantine.set_aside_record(names(self.settings.namespace), "effects", message, reason)
        await self.producer.send_and_wait(*record)
        self.metrics.set_aside.labels("effects", dict(record[3]).get("gateway", b"").decode() or "unknown").inc()

    async def start(self) -> None:
        await self.producer.start()
        await self.sink.start()
        self.open_http()

    def open_http(self) -> None:
        """The client of every delivery. Its deadline is the whole request, the merchant's answer read
        included (ORDERLY_EFFECTS_TIMEOUT_S): a merchant that never answers holds a delivery slot
        this long, then the delivery is retried on its schedule."""
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.settings.effects_timeout_s))

    async def stop(self) -> None:
        await self.drain(STOP_GRACE_S)
        await self.sink.stop()
        await self.producer.stop()
        if self.http is not None:
            await self.http.close()

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for the deliveries in flight; those still running after ``timeout_s`` are cancelled
        (their rows stay claimed until the lease ends, then are delivered again: the merchant has
        the Idempotency-Key for that)."""
        if not self.in_flight:
            return
        _, pending = await asyncio.wait(set(self.in_flight), timeout=timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def deliver_due(self) -> int:
        """Claim as many due effects as there are free delivery slots and start POSTing them;
        returns how many were claimed. Claiming no more than can be sent at once keeps every claimed
        row's lease for its own request, not for a wait in a queue."""
        if self.failed is not None:
            raise self.failed
        pool = self.sink.pool
        assert pool is not None and self.http is not None and self.settings.effects_url
        free = min(self.settings.effects_concurrency - len(self.in_flight), CLAIM_BATCH)
        if free <= 0:
            return 0
        rows = await pool.fetch(CLAIM_DUE, free, self.settings.effects_lease_s)  # its own short transaction
        # a row whose delivery here still waits to be marked (PostgreSQL was away past its lease) is
        # not sent again: the merchant answered it already
        rows = [row for row in rows if row["dedupe_key"] not in self.delivering]
        for row in rows:
            self.delivering.add(row["dedupe_key"])
            task = asyncio.create_task(self._deliver(row))
            self.in_flight.add(task)
            task.add_done_callback(self._done)
        return len(rows)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        if not task.cancelled() and task.exception() is not None and self.failed is None:
            self.failed = task.exception()

    async def _post(self, url: str, row: Any) -> str | None:
        """One signed POST; the error to record, or None when the merchant answered 2xx."""
        assert self.http is not None and self.key is not None
        try:
            body = request_body(row)
            async with self.slots:
                self.metrics.in_flight.inc()
                started = time.monotonic()
                try:
                    # signed at send time: the timestamp is this attempt's, which the merchant checks
                    # against its clock (Standard Webhooks allow five minutes)
                    headers = {"Idempotency-Key": row["dedupe_key"], "Content-Type": "application/json",
                               **signed_headers(self.key, row["dedupe_key"], int(time.time()), body)}
                    # no redirect followed: it would re-send the signed body and its Idempotency-Key
                    # wherever the answer points, and a 2xx there would mark the effect delivered
                    async with self.http.post(url, data=body, headers=headers, allow_redirects=False) as resp:
                        return None if 200 <= resp.status < 300 else await refusal(resp)
                finally:
                    self.metrics.in_flight.dec()
                    self.metrics.request_seconds.observe(time.monotonic() - started)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a row no request can be made from: it backs off and ends dead, visibly
            return f"{type(exc).__name__}: {exc}"

    async def _mark(self, query: str, *args: Any) -> None:
        """Write a delivery's outcome, waiting for PostgreSQL if it is away: a 2xx not written down
        would be sent again after the lease."""
        pool = self.sink.pool
        assert pool is not None
        waited = False
        while True:
            try:
                await pool.execute(query, *args)
            except UNREACHABLE as exc:
                self.readiness.down("postgres", exc)
                waited = True
                await asyncio.sleep(RETRY_S)
                continue
            if waited:
                self.readiness.up("postgres")
            return

    async def _deliver(self, row: Any) -> None:
        try:
            await self._deliver_once(row)
        finally:
            self.delivering.discard(row["dedupe_key"])

    async def _deliver_once(self, row: Any) -> None:
        url = self.settings.effects_url
        assert url is not None
        error = await self._post(url, row)
        if error is None:
            await self._mark(MARK_DELIVERED, row["dedupe_key"])
            self.metrics.delivered.labels(row["type"]).inc()
            return
        attempts = row["attempts"] + 1
        await self._mark(MARK_FAILED, row["dedupe_key"], printable(error)[:500],
                         backoff_s(attempts, self.rng.random()), self.settings.effects_max_attempts)
        self.metrics.failures.labels(row["type"]).inc()
        if attempts >= self.settings.effects_max_attempts:
            self.metrics.dead.inc()
            log.error("effect %s is dead after %d attempts: %s", row["dedupe_key"], attempts, error,
                      extra={"gateway": row["gateway"], "resource_id": row["resource_id"], "effect": row["dedupe_key"]})

    async def read_pending(self) -> None:
        """The backlog gauges: effects neither delivered nor dead, the age of the oldest, the dead ones."""
        assert self.sink.pool is not None
        row = await self.sink.pool.fetchrow(PENDING)
        assert row is not None
        self.metrics.pending.set(row["pending"])
        self.metrics.oldest_pending_s.set(row["oldest_s"])
        self.metrics.dead_records.set(row["dead"])

    async def read_lag(self) -> None:
        self.metrics.consumer_lag.labels(self.sink.name, self.sink.topic).set(await self.sink.lag())


async def run(settings: Settings) -> None:
    worker = EffectsWorker(settings)
    if not worker.deliver:
        log.warning("ORDERLY_EFFECTS_URL is not set: effects are recorded in PostgreSQL but not delivered")
    # stopped in reverse order however the run ends, a SIGTERM during the start included
    async with contextlib.AsyncExitStack() as started:
        await start_service(started, worker, worker.metrics.registry, settings.metrics_port, settings.metrics_host,
                            worker.readiness)
        beside(started, every(PENDING_EVERY_S, worker.read_lag, "the effects recorder's lag"))
        pending_at = 0.0
        while True:
            try:
                recorded = await worker.sink.run_once(timeout_ms=100)
                attempted = await worker.deliver_due() if worker.deliver else 0
                if time.monotonic() >= pending_at:
                    await worker.read_pending()
                    pending_at = time.monotonic() + PENDING_EVERY_S
            except UNREACHABLE as exc:  # PostgreSQL away: wait, not ready; deliveries in flight wait to be marked
                assert worker.sink.pool is not None
                await wait_for_postgres(worker.sink.pool, worker.readiness, exc)
                continue
            if not recorded and not attempted:
                await asyncio.sleep(0.05)
