"""`orderly fetcher`: asks the gateway when a parked event has waited too long (I/O shell).

What to ask and how the answer becomes a record is each gateway's ``fetch`` declaration in the
registry (app/gateways/registry.py's Fetch), carried out here for the enabled gateways whose
``ORDERLY_<NAME>_API_URL`` is set. The card playbook: a payment holding a parked event older than the
retry interval (60 s) is fetched with ``GET /payments/{ref}``, the answer appended to ``orderly.raw``
as a ``synced`` event whose id is derived from the ref, state and totals (an unchanged repeat is a
duplicate; the reducer takes it as the new base). pg's sequence gaps are backfilled from its events
API. Fetches are rate-limited and retried; a 404 or a 5xx appends nothing: it cannot corrupt state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from app import pg_pool
from app.effects import require_https
from app.fetch_passes import FullPasses
from app.fetch_requests import consume_fetch_requests
from app.gateways import registry
from app.gateways.limits import body_error
from app.gateways.registry import Fetch, Gateway
from app.kafka_client import client_options
from app.metrics import FetcherMetrics, beside, every, start_service
from app.producer import KeyedProducer
from app.readiness import UNREACHABLE, Readiness, wait_for_postgres
from app.settings import Settings
from app.sweeper import Sweeper
from projections import sql
from topics.catalog import names
from topics.records import H_SOURCE_KEY, H_TOPIC, quarantine_headers, raw_headers

log = logging.getLogger("orderly.fetcher")

# A resource the gateway answered the same way as last time (404, an unusable or an unchanged answer)
# is asked again after twice the wait, up to an hour (errors and timeouts do not count: an API outage
# must not push every parked payment back): 500 payments no answer resolves (a sender inventing refs
# with a leaked secret, say) would otherwise take every pass's 500 places for ever, the newer never fetched.
MAX_BACKOFF_S = 3600.0
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # a gateway's answer about one resource, or one page of its events
LAG_EVERY_S = 5.0  # how often the lag of the fetch requests' group is read


def fetching(settings: Settings) -> list[tuple[Gateway, Fetch, str]]:
    """(gateway, its fetch, its API base) of each enabled gateway that can be fetched from here."""
    found = []
    for name in settings.gateways:
        gateway = registry.find(name)
        url = settings.api_urls.get(name)
        if gateway is not None and gateway.fetch is not None and url:
            found.append((gateway, gateway.fetch, url))
    return found


def fetched_delivery_id(event_id: str, each: bool = True) -> str:
    """The delivery id of what the fetcher appends or sets aside: its event id, and with ``each`` 12
    random hex digits (each fetched answer a delivery of its own; without, the same event one id: one
    quarantined record, one backfilled delivery). Within limits.DELIVERY_ID_MAX, the admin's limit."""
    return f"fetch-{event_id}~{uuid.uuid4().hex[:12]}" if each else f"fetch-{event_id}"


class BackfillUnavailable(Exception):
    """The gateway's events API did not answer usefully: the gap is requested again later."""


class Fetcher:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = FetcherMetrics()
        self.producer = KeyedProducer(settings.kafka_bootstrap, **client_options(settings))
        self.pool: asyncpg.Pool | None = None
        self.http: aiohttp.ClientSession | None = None
        self._next_slot = 0.0
        # resource key -> (last answer, repeats, next due)
        self._unchanged: dict[str, tuple[str, int, float]] = {}
        self.passes = FullPasses()
        self._fetch_errors: dict[str, int] = {}  # per gateway: fetches the API failed (5xx, 429, no answer)
        self.requests: AIOKafkaConsumer | None = None  # orderly.fetch's consumer, once started
        self.readiness = Readiness()

    async def read_lag(self) -> None:
        """orderly_consumer_lag of the fetcher's Kafka group: fetch requests not carried out yet."""
        consumer, topic = self.requests, names(self.settings.namespace).fetch
        if consumer is None:
            return
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        ends = await consumer.end_offsets(tps)
        lag = sum([ends[tp] - (await consumer.committed(tp) or 0) for tp in tps])
        self.metrics.consumer_lag.labels(f"{self.settings.namespace}-fetcher", topic).set(max(0, lag))

    async def start(self) -> None:
        await self.producer.start()
        self.pool = await pg_pool.create_pool(self.settings.postgres_dsn.reveal(), self.settings.namespace,
                                              min_size=1, max_size=2)
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def stop(self) -> None:
        await self.producer.stop()
        if self.pool is not None:
            await self.pool.close()
        if self.http is not None:
            await self.http.close()

    async def _throttle(self) -> None:
        # at most fetch_rate_per_s requests a second: the gateway's API is someone else's
        now = time.monotonic()
        wait = self._next_slot - now
        self._next_slot = max(now, self._next_slot) + 1.0 / self.settings.fetch_rate_per_s
        if wait > 0:
            await asyncio.sleep(wait)

    def auth(self, gateway: str) -> dict[str, str]:
        """The gateway's API key as a bearer token, when its ``ORDERLY_<NAME>_API_KEY`` is set."""
        key = self.settings.api_keys.get(gateway)
        return {"Authorization": f"Bearer {key.reveal()}"} if key is not None else {}

    async def fetch_resource(self, gateway: str, url: str, resource_id: str, attempts: int = 3) -> Any:
        """The gateway's JSON answer for one resource (``url``: its GET URL), or None (a 404 remembered)."""
        assert self.http is not None
        fetches = self.metrics.fetches
        outage = False
        for attempt in range(1, attempts + 1):
            await self._throttle()
            try:
                # no redirect followed: it would carry the API key wherever the answer points
                async with self.http.get(url, headers=self.auth(gateway), allow_redirects=False) as resp:
                    if resp.status == 200:
                        return await read_answer(resp)
                    if 300 <= resp.status < 400:
                        log.warning("the %s API answered %d (to %s) for %s: a redirect is not followed", gateway,
                                    resp.status, resp.headers.get("Location", "?")[:200], resource_id)
                    if resp.status == 404:
                        fetches.labels(gateway, "not_found").inc()
                        self._answered(f"{gateway}:{resource_id}", "not found")
                        return None
                    fetches.labels(gateway, "error").inc()
                    outage = resp.status >= 500 or resp.status == 429
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                fetches.labels(gateway, "error").inc()
                outage = not isinstance(exc, ValueError)  # an answer that does not read is the resource's
            await asyncio.sleep(min(0.2 * 2 ** attempt, 5.0))
        if outage:  # the API failing (fetch_passes.py: a full pass is then not complete)
            self._fetch_errors[gateway] = self._fetch_errors.get(gateway, 0) + 1
        return None

    async def sync_parked(self) -> int:
        """One pass: fetch every resource with a stale parked event, of each gateway that fetches
        resources (app/fetch_passes.py: all of them, or those that can have changed); returns synced
        events appended."""
        assert self.pool is not None
        now = time.monotonic()
        waiting = {key for key, (_, _, due) in self._unchanged.items() if due > now}
        parked: set[str] = set()
        appended = 0
        for gateway, fetch, _ in fetching(self.settings):
            if fetch.parked is None:
                continue
            name = gateway.name
            mine = [key.partition(":")[2] for key in waiting if key.startswith(f"{name}:")]
            asked = [key.partition(":")[2] for key in set(self._unchanged) - waiting if key.startswith(f"{name}:")]
            wanted = await self.passes.wanted(self.pool, name, fetch, self.settings.fetch_parked_after_s, mine,
                                              asked, now)
            parked.update(f"{name}:{i}" for i in wanted.ids)
            failed = self._fetch_errors.get(name, 0)
            for resource_id in wanted.ids:
                appended += await self.sync_resource(name, resource_id)
            failed = self._fetch_errors.get(name, 0) - failed
            if not self.passes.fetched(name, wanted, failed, now):
                log.info("%s: a full pass found %d resources, %d fetches failed at the API: the next pass is a "
                         "full one too", name, len(wanted.ids), failed)
        for key in set(self._unchanged) - waiting - parked:
            del self._unchanged[key]  # no longer parked: forgotten
        self.metrics.backing_off.set(len(waiting))
        self.metrics.passes.inc()  # a pass done: what a test of "not asked again" waits for
        return appended

    def _answered(self, key: str, answer: str) -> None:
        """Remember what the gateway said about resource ``key``; the same answer again doubles the wait."""
        last, repeats, _ = self._unchanged.get(key, ("", -1, 0.0))
        repeats = repeats + 1 if answer == last else 0
        wait = min(self.settings.fetch_parked_after_s * 2 ** repeats, MAX_BACKOFF_S) if repeats else 0.0
        self._unchanged[key] = (answer, repeats, time.monotonic() + wait)

    async def sync_resource(self, name: str, resource_id: str) -> int:
        """Fetch one resource and append the gateway's answer as a synced event; returns 1 if
        appended, 0 if the gateway did not answer usefully (logged and counted)."""
        gateway, url = registry.find(name), self.settings.api_urls.get(name)
        fetch = gateway.fetch if gateway is not None else None
        if fetch is None or fetch.resource is None or fetch.synced is None or not url:
            return 0
        key = f"{name}:{resource_id}"
        answers = []
        for path in (fetch.resource, *((fetch.also,) if fetch.also else ())):
            answer = await self.fetch_resource(name, url + path.replace("{id}", quote(resource_id, safe="")),
                                               resource_id)
            if answer is None:  # a 404 was remembered; an error or a timeout is the API's, not the resource's
                return 0
            answers.append(answer)
        answer = tuple(answers) if fetch.also else answers[0]  # with ``also``: the pair (registry.Fetch)
        try:
            body = fetch.synced(resource_id, answer, int(time.time() * 1000))
        except Exception as exc:  # whatever the gateway answered, nothing is appended and the caller goes on
            log.error("unusable gateway answer for %s: %s: %s", resource_id, type(exc).__name__, exc,
                      extra={"gateway": name, "resource_id": resource_id})
            self.metrics.fetches.labels(name, "unusable").inc()
            self._answered(key, "unusable")
            self.metrics.set_aside.labels("fetcher", name).inc()
            return 0
        # each fetch is a delivery of its own: an unchanged answer has the same event id (a duplicate in
        # the timeline), never the same delivery id (the worker would decide it "synced" once more)
        event_id = orjson.loads(body)["id"]
        if (problem := body_error(body)) is not None:  # past the limits every input keeps
            log.error("gateway answer for %s set aside: %s", resource_id, problem,
                      extra={"gateway": name, "resource_id": resource_id})
            self.metrics.fetches.labels(name, "unusable").inc()
            self._answered(key, "unusable")  # asked again later and later; the same answer is one quarantined record
            await self.set_aside(name, key, body, fetched_delivery_id(event_id, each=False), problem)
            return 0
        self._answered(key, event_id)
        delivery_id = fetched_delivery_id(event_id)
        await self.producer.send_and_wait(names(self.settings.namespace).raw, key.encode(), body,
                                          raw_headers(name, delivery_id, int(time.time() * 1000), source="fetch"))
        self.metrics.fetches.labels(name, "synced").inc()
        return 1

    async def set_aside(self, gateway: str, resource_key: str | None, body: bytes, delivery_id: str,
                        reason: str) -> None:
        """What the fetcher would have appended to orderly.raw, to orderly.quarantine instead, as the
        ingest and the worker set a record aside: listed with the stage and reason (in its resource's
        timeline when it has one), redriven to orderly.raw once fixed."""
        headers = [(H_TOPIC, names(self.settings.namespace).raw.encode()),
                   (H_SOURCE_KEY, (resource_key or "").encode()),
                   *raw_headers(gateway, delivery_id, int(time.time() * 1000), source="fetch")]
        await self.producer.send_and_wait(names(self.settings.namespace).quarantine, delivery_id.encode(), body,
                                          quarantine_headers(headers, "fetcher", reason, resource_key))
        self.metrics.set_aside.labels("fetcher", gateway).inc()

    async def backfill(self, gateway: Gateway, base: str, path: str, request: dict[str, Any]) -> int:
        """Fetch the events of a sequence gap that outlived its retry window from the gateway's event
        log (``base`` + ``path``); append each to orderly.raw (the worker dedupes on the event id if
        the webhook did arrive after all)."""
        assert self.http is not None
        name, url = gateway.name, base + path
        since, until = int(request["since_sequence"]), int(request["until_sequence"])
        appended = 0
        while since < until:
            await self._throttle()
            try:
                async with self.http.get(url, params={"since_sequence": str(since), "limit": "100"},
                                         headers=self.auth(name), allow_redirects=False) as resp:
                    if resp.status != 200:  # a redirect too: it is not followed
                        raise BackfillUnavailable(f"GET {path} answered {resp.status}")
                    page = (await read_answer(resp))["data"]
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise BackfillUnavailable(f"GET {path} failed: {type(exc).__name__}") from exc
            if not page:
                break
            for event in page:
                if event.get("sequence", until + 1) > until:
                    return appended
                raw = orjson.dumps(event)
                route = gateway.adapter.route(raw)
                if route.resource_key is None:  # the ingest's own refusal (limits included)
                    reason = route.quarantine_reason or "refused"
                    log.error("backfilled %s event %s set aside: %s", name, event.get("id"), reason)
                    await self.set_aside(name, route.resource_hint, raw,
                                         fetched_delivery_id(route.event_id or uuid.uuid4().hex[:12], each=False),
                                         reason)
                    continue
                await self.producer.send_and_wait(
                    names(self.settings.namespace).raw, route.resource_key.encode(), raw,
                    raw_headers(name, fetched_delivery_id(str(route.event_id), each=False), int(time.time() * 1000),
                                source="fetch"))
                self.metrics.fetches.labels(name, "synced").inc()
                appended += 1
            last = int(page[-1]["sequence"])
            if last <= since:  # a page that does not move forward would be asked for again for ever
                raise ValueError(f"the gateway's events page after sequence {since} ends at {last}")
            since = last
        return appended

    async def not_done(self, gateway: str, request: dict[str, Any], exc: BackfillUnavailable) -> None:
        """Not lost: the gap, or what late events left of it, is marked not requested, so the projector
        asks again (PostgreSQL away: once it is back)."""
        self.metrics.fetches.labels(gateway, "error").inc()
        start, until = int(request["since_sequence"]) + 1, int(request["until_sequence"])
        log.warning("backfill of the %s gap from %d not done (%s); requested again later", gateway, start, exc)
        assert self.pool is not None
        while True:
            try:
                async with self.pool.acquire() as conn, conn.transaction():  # after the projector's writes
                    await conn.execute(sql.LOCK_SEQUENCES)
                    await conn.execute(sql.UNMARK_BACKFILLS_REQUESTED, gateway, start, until)
                return
            except UNREACHABLE as exc:  # the unmark, not the fetch, is done again once PostgreSQL is back
                await wait_for_postgres(self.pool, self.readiness, exc)

    async def carry_out(self, request: Any) -> None:
        """One request of orderly.fetch: a backfill (a sequence gap older than the limit) or a resource
        an operator asked for."""
        name = request.get("gateway")
        gateway = registry.find(name) if isinstance(name, str) else None
        fetch = gateway.fetch if gateway is not None else None
        if gateway is None or fetch is None:
            return
        url = self.settings.api_urls.get(gateway.name)
        if request.get("kind") == "backfill" and fetch.backfill is not None:
            try:
                if not url:  # marked not requested: asked again once it is set
                    raise BackfillUnavailable(f"ORDERLY_{gateway.name.upper()}_API_URL is not set")
                await self.backfill(gateway, url, fetch.backfill, request)
            except BackfillUnavailable as exc:
                await self.not_done(gateway.name, request, exc)
        elif fetch.kind and request.get("kind") == fetch.kind:
            # an operator's "fetch now" (the admin API): the same fetch the parked sweep makes
            if url:
                await self.sync_resource(gateway.name, str(request[fetch.id_field]))
            else:
                log.warning("%s fetch requested but ORDERLY_%s_API_URL is not set: not done", gateway.name,
                            gateway.name.upper())


async def read_answer(resp: aiohttp.ClientResponse) -> Any:
    """A 200 answer's JSON, read up to MAX_ANSWER_BYTES (ValueError past that, or when it is not
    JSON). orjson, not the json module: nesting past its limit is a decode error, never a
    RecursionError that would escape every handler and loop the fetcher."""
    raw = bytearray()
    async for chunk in resp.content.iter_chunked(64 * 1024):
        raw += chunk
        if len(raw) > MAX_ANSWER_BYTES:
            raise ValueError(f"the answer is over {MAX_ANSWER_BYTES} bytes")
    return orjson.loads(raw)


def check_api_urls(settings: Settings) -> None:
    """Each gateway API is asked over https, or http to a loopback address (or with
    ORDERLY_FETCH_ALLOW_HTTP): a request may carry the API key, and its answer becomes a record."""
    for name, url in settings.api_urls.items():
        if url:
            require_https(f"ORDERLY_{name.upper()}_API_URL", url, "the gateway's API is asked",
                          ("ORDERLY_FETCH_ALLOW_HTTP", settings.fetch_allow_http))


async def run(settings: Settings) -> None:
    check_api_urls(settings)
    fetcher = Fetcher(settings)
    for name in settings.gateways:
        gateway = registry.find(name)
        if gateway is not None and gateway.fetch is not None and not settings.api_urls.get(name):
            log.warning("ORDERLY_%s_API_URL is not set: %s resources are not fetched from its API", name.upper(), name)
    # stopped in reverse order however the run ends (a SIGTERM during the start too): a consumer leaves its group
    async with contextlib.AsyncExitStack() as started:
        await start_service(started, fetcher, fetcher.metrics.registry, settings.metrics_port, settings.metrics_host,
                            fetcher.readiness)
        # without a gateway API nothing can carry a request out: they wait in orderly.fetch, unread
        consume = consume_fetch_requests(fetcher, settings) if fetching(settings) else asyncio.Event().wait()
        requests = beside(started, consume)
        assert fetcher.pool is not None
        sweeper = Sweeper(settings, fetcher.pool, fetcher.producer,
                          lambda topic: fetcher.metrics.reappended.labels(topic).inc())
        started.push_async_callback(sweeper.stop)
        await sweeper.start()
        beside(started, every(LAG_EVERY_S, fetcher.read_lag, "the fetch requests' lag"))
        tick = min(settings.fetch_interval_s, max(1.0, settings.sweep_after_s / 4))
        next_sync = 0.0
        while not requests.done() or requests.result():  # its end (Kafka out of reach) raises here
            try:
                if time.monotonic() >= next_sync:
                    await fetcher.sync_parked()
                    next_sync = time.monotonic() + settings.fetch_interval_s
                await sweeper.sweep()
            except UNREACHABLE as exc:  # PostgreSQL away: wait, not ready, then go on
                await wait_for_postgres(fetcher.pool, fetcher.readiness, exc)
            await asyncio.sleep(tick)

