"""`orderly fetcher`: asks the gateway when a parked event has waited too long (I/O shell).

The card playbook: parking is the right first answer, but a payment holding a parked event older
than the retry interval (60 s) is fetched with ``GET /payments/{ref}``. The answer is appended to
``orderly.raw`` as a ``synced`` event whose id is derived from the ref, state and totals, so an
unchanged repeat is a duplicate; the reducer takes it as the new base. Fetches are rate-limited and
retried; a 404 or a 5xx appends nothing, so it can never corrupt state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from app.gateways import pg as pg_gateway
from app.gateways.limits import int64_error
from app.kafka_client import client_options
from app.metrics import FetcherMetrics, every, serve_metrics
from app.producer import KeyedProducer
from app.settings import Settings
from app.sweeper import Sweeper
from projections import quarantine
from projections.migrate import quote_ident
from topics.catalog import names
from topics.records import raw_headers

log = logging.getLogger("orderly.fetcher")

PARKED_CARD_PAYMENTS = """
SELECT payment_ref FROM card_events WHERE applied_at IS NULL AND source = 'webhook'
   AND payment_ref <> ALL($2::text[])
 GROUP BY payment_ref HAVING min(received_at) < now() - make_interval(secs => $1)
 ORDER BY min(received_at) LIMIT 500"""
# A payment the gateway answered the same way as last time (404, an unusable or an unchanged answer)
# is asked again after twice the wait, up to an hour (errors and timeouts do not count: an outage of
# the API must not push every parked payment back once it is over): 500 payments that no answer resolves (a sender
# inventing refs with a leaked secret, say) would otherwise take every pass's 500 places for ever,
# the newer parked payments behind them never fetched.
MAX_BACKOFF_S = 3600.0
LAG_EVERY_S = 5.0  # how often the lag of the fetch requests' group is read
STATES = {"created", "authorised", "captured", "refunded", "voided"}


def synced_event(ref: str, answer: Any, now_ms: int) -> bytes:
    """The gateway's answer as a raw event; its id makes an unchanged repeat a duplicate."""
    if not isinstance(answer, dict):
        raise ValueError(f"the answer is not a JSON object: {type(answer).__name__}")
    totals = {k: answer.get(k) or 0 for k in ("authorised_minor", "captured_minor", "refunded_minor")}
    # money as the webhooks carry it: integers within signed 64 bits, never negative, never a float
    if answer.get("state") not in STATES or any(int64_error(k, v) or v < 0 for k, v in totals.items()):
        raise ValueError(f"unusable gateway answer for {ref}: {str(answer)[:300]}")
    if not isinstance(answer.get("currency"), str) or not 1 <= len(answer["currency"]) <= 8:
        raise ValueError(f"unusable currency in the gateway's answer for {ref}")
    event_id = "sync_{}_{}_{}_{}_{}".format(ref, answer["state"], *totals.values())
    return orjson.dumps({
        "id": event_id, "type": "synced", "payment_ref": ref, "sequence": None,
        "occurred_at": datetime.fromtimestamp(now_ms / 1000, UTC).isoformat().replace("+00:00", "Z"),
        "amount_minor": 0, "currency": answer.get("currency"),
        "synced": {"state": answer["state"], **totals}})


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
        self._unchanged: dict[str, tuple[str, int, float]] = {}  # ref -> (last answer, repeats, next due)
        self.requests: AIOKafkaConsumer | None = None  # orderly.fetch's consumer, once started

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
        self.pool = await asyncpg.create_pool(self.settings.postgres_dsn.reveal(), min_size=1, max_size=2,
                                              server_settings={"search_path": quote_ident(self.settings.namespace)})
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

    async def fetch_payment(self, ref: str, attempts: int = 3) -> dict[str, Any] | None:
        assert self.http is not None and self.settings.card_api_url
        for attempt in range(1, attempts + 1):
            await self._throttle()
            try:
                async with self.http.get(f"{self.settings.card_api_url}/payments/{quote(ref, safe='')}") as resp:
                    if resp.status == 200:
                        body: dict[str, Any] = await resp.json()
                        return body
                    if resp.status == 404:
                        self.metrics.fetches.labels("card", "not_found").inc()
                        self._answered(ref, "not found")
                        return None
                    self.metrics.fetches.labels("card", "error").inc()
            except (aiohttp.ClientError, TimeoutError, ValueError):
                self.metrics.fetches.labels("card", "error").inc()
            await asyncio.sleep(min(0.2 * 2 ** attempt, 5.0))
        return None

    async def sync_parked_card_payments(self) -> int:
        """One pass: fetch every payment with a stale parked event; returns synced events appended."""
        assert self.pool is not None
        if not self.settings.card_api_url:
            return 0
        now = time.monotonic()
        waiting = [ref for ref, (_, _, due) in self._unchanged.items() if due > now]
        refs = [r["payment_ref"] for r in await self.pool.fetch(PARKED_CARD_PAYMENTS,
                                                                self.settings.fetch_parked_after_s, waiting)]
        for ref in set(self._unchanged) - set(waiting) - set(refs):
            del self._unchanged[ref]  # no longer parked: forgotten
        appended = 0
        for ref in refs:
            appended += await self.sync_card_payment(ref)
        self.metrics.backing_off.set(len(waiting))
        return appended

    def _answered(self, ref: str, answer: str) -> None:
        """Remember what the gateway said about ``ref``; the same answer again doubles the wait."""
        last, repeats, _ = self._unchanged.get(ref, ("", -1, 0.0))
        repeats = repeats + 1 if answer == last else 0
        wait = min(self.settings.fetch_parked_after_s * 2 ** repeats, MAX_BACKOFF_S) if repeats else 0.0
        self._unchanged[ref] = (answer, repeats, time.monotonic() + wait)

    async def sync_card_payment(self, ref: str) -> int:
        """Fetch one card payment and append the gateway's answer as a synced event; returns 1 if
        appended, 0 if the gateway did not answer usefully (logged and counted)."""
        answer = await self.fetch_payment(ref)
        if answer is None:  # a 404 was remembered; an error or a timeout is the API's, not the payment's
            return 0
        try:
            body = synced_event(ref, answer, int(time.time() * 1000))
        except Exception as exc:  # whatever the gateway answered, nothing is appended and the caller goes on
            log.error("unusable gateway answer for %s: %s: %s", ref, type(exc).__name__, exc,
                      extra={"gateway": "card", "resource_id": ref})
            self.metrics.fetches.labels("card", "unusable").inc()
            self._answered(ref, "unusable")
            self.metrics.set_aside.labels("fetcher", "card").inc()
            return 0
        # each fetch is a delivery of its own: an unchanged answer has the same event id (a duplicate,
        # shown in the timeline as one), never the same delivery id (the worker would take it for
        # the first one appended again and decide it "synced" once more)
        event_id = orjson.loads(body)["id"]
        self._answered(ref, event_id)
        delivery_id = f"fetch-{event_id}~{uuid.uuid4().hex[:12]}"
        await self.producer.send_and_wait(names(self.settings.namespace).raw, f"card:{ref}".encode(), body,
                                          raw_headers("card", delivery_id, int(time.time() * 1000), source="fetch"))
        self.metrics.fetches.labels("card", "synced").inc()
        return 1

    async def backfill_pg(self, request: dict[str, Any]) -> int:
        """Fetch the events of a pg sequence gap that outlived its retry window; append each to
        orderly.raw (the worker dedupes on the event id if the webhook did arrive after all)."""
        assert self.http is not None and self.settings.pg_api_url
        since, until = int(request["since_sequence"]), int(request["until_sequence"])
        appended = 0
        while since < until:
            await self._throttle()
            try:
                async with self.http.get(f"{self.settings.pg_api_url}/v1/pay/events",
                                         params={"since_sequence": str(since), "limit": "100"}) as resp:
                    if resp.status != 200:
                        raise BackfillUnavailable(f"GET /v1/pay/events answered {resp.status}")
                    page = (await resp.json())["data"]
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise BackfillUnavailable(f"GET /v1/pay/events failed: {type(exc).__name__}") from exc
            if not page:
                break
            for event in page:
                if event.get("sequence", until + 1) > until:
                    return appended
                raw = orjson.dumps(event)
                route = pg_gateway.route(raw)
                if route.resource_key is None:
                    log.error("backfilled pg event %s cannot be routed: %s", event.get("id"), route.quarantine_reason)
                    continue
                await self.producer.send_and_wait(
                    names(self.settings.namespace).raw, route.resource_key.encode(), raw,
                    raw_headers("pg", f"fetch-{route.event_id}", int(time.time() * 1000), source="fetch"))
                self.metrics.fetches.labels("pg", "synced").inc()
                appended += 1
            last = int(page[-1]["sequence"])
            if last <= since:  # a page that does not move forward would be asked for again for ever
                raise ValueError(f"the gateway's events page after sequence {since} ends at {last}")
            since = last
        return appended


async def _consume_fetch_requests(fetcher: Fetcher, settings: Settings) -> None:
    """orderly.fetch → backfills (pg sequence gaps older than the limit) and card fetches an operator
    asked for. A request that cannot be
    carried out (a malformed one, an answer the fetcher cannot read) is set aside to quarantine
    and the next one is taken."""
    producer = fetcher.producer
    consumer = AIOKafkaConsumer(names(settings.namespace).fetch, bootstrap_servers=settings.kafka_bootstrap,
                                group_id=f"{settings.namespace}-fetcher", enable_auto_commit=False,
                                group_instance_id=settings.instance_member,  # static membership
                                auto_offset_reset="earliest", isolation_level="read_committed",
                                **client_options(settings))
    await consumer.start()
    fetcher.requests = consumer
    try:
        async for message in consumer:
            try:
                request = orjson.loads(message.value)
                if request.get("gateway") == "pg" and request.get("kind") == "backfill":
                    if not settings.pg_api_url:  # marked not requested: asked again once it is set
                        raise BackfillUnavailable("ORDERLY_PG_API_URL is not set")
                    await fetcher.backfill_pg(request)
                elif request.get("gateway") == "card" and request.get("kind") == "payment":
                    # an operator's "fetch now" (the admin API): the same fetch the parked sweep makes
                    if settings.card_api_url:
                        await fetcher.sync_card_payment(str(request["payment_ref"]))
                    else:
                        log.warning("card fetch requested but ORDERLY_CARD_API_URL is not set: not done")
            except BackfillUnavailable as exc:
                # not lost: the gap is marked not requested, so the projector asks again at its next
                # check (every 30 s at most), until the API answers
                fetcher.metrics.fetches.labels("pg", "error").inc()
                start = int(request["since_sequence"]) + 1
                log.warning("backfill of the pg gap from %d not done (%s); requested again later", start, exc)
                assert fetcher.pool is not None
                await fetcher.pool.execute("UPDATE pg_sequence_gaps SET backfill_requested_at = NULL "
                                           "WHERE merchant = 'pg' AND start_seq = $1", start)
            except KafkaError:
                raise  # Kafka out of reach: the supervisor restarts the fetcher
            except Exception as exc:  # the request's own fault: set aside, never retried for ever
                reason = f"{type(exc).__name__}: {exc}"[:500]
                log.error("fetch request %s[%d]@%d set aside: %s", message.topic, message.partition, message.offset,
                          reason)
                await producer.send_and_wait(*quarantine.set_aside_record(names(settings.namespace), "fetcher",
                                                                          message, reason))
                fetcher.metrics.set_aside.labels("fetcher", "pg").inc()
            await consumer.commit()
    finally:
        await consumer.stop()


async def run(settings: Settings) -> None:
    fetcher = Fetcher(settings)
    if not settings.card_api_url:
        log.warning("ORDERLY_CARD_API_URL is not set: parked card payments are not fetched")
    if not settings.pg_api_url:
        log.warning("ORDERLY_PG_API_URL is not set: pg sequence gaps are not backfilled")
    # stopped in reverse order however the run ends, a SIGTERM during the start included: the
    # requests' consumer leaves its group before the process ends
    async with contextlib.AsyncExitStack() as started:
        started.push_async_callback(fetcher.stop)
        await fetcher.start()
        if settings.metrics_port:
            runner = await serve_metrics(fetcher.metrics.registry, settings.metrics_port, settings.metrics_host)
            started.push_async_callback(runner.cleanup)
        # without a gateway API nothing can carry a request out: they wait in orderly.fetch, unread
        requests = asyncio.create_task(_consume_fetch_requests(fetcher, settings)
                                       if settings.pg_api_url or settings.card_api_url else asyncio.Event().wait())
        started.push_async_callback(_cancelled, requests)
        assert fetcher.pool is not None
        sweeper = Sweeper(settings, fetcher.pool, fetcher.producer,
                          lambda topic: fetcher.metrics.reappended.labels(topic).inc())
        started.push_async_callback(sweeper.stop)
        await sweeper.start()
        lag = asyncio.create_task(every(LAG_EVERY_S, fetcher.read_lag, "the fetch requests' lag"))
        started.callback(lag.cancel)
        tick = min(settings.fetch_interval_s, max(1.0, settings.sweep_after_s / 4))
        next_card_sync = 0.0
        while True:
            if time.monotonic() >= next_card_sync:
                await fetcher.sync_parked_card_payments()
                next_card_sync = time.monotonic() + settings.fetch_interval_s
            await sweeper.sweep()
            await asyncio.sleep(tick)


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has cleaned up."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
