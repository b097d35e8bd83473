"""The receiver: a signed webhook's way from its raw bytes to its answer (I/O shell around the adapters)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol

import orjson
from aiohttp import web

from app.gateways import registry
from app.gateways.base import Route, SignatureError
from app.ingest.answers import Unavailable, refusal
from app.ingest.appender import Appender
from app.ingest.body import ENCODED_REASON, MAX_BODY, OUTCOMES, BodyRefused, encoded, read_body, refuse_body
from app.ingest.deliveries import next_delivery_id
from app.logs import SampledLog, bound
from app.metrics import IngestMetrics
from app.problem import CONTENT_TYPE as PROBLEM
from app.problem import problem_bytes
from app.settings import Settings
from app.webhook_http import log_unexpected
from topics.catalog import TopicNames
from topics.records import CHECKED, quarantine_headers, raw_headers


def part_id(gateway: str, value: bytes) -> str:
    """A delivery id derived from a quarantined part's bytes (as long as next_delivery_id's)."""
    return hashlib.sha256(gateway.encode() + b"\0" + value).hexdigest()[:28]


class Batched(Protocol):
    """An adapter's optional capability: one verified body is several records (Adyen's notification
    items), each stored under its own key, and the gateway expects its own success answer."""

    ACCEPTED: bytes

    def split(self, raw: bytes) -> list[tuple[bytes, Route]]: ...


class Receiver:
    """A signed webhook's way from its raw bytes to its answer, whichever HTTP layer read it (aiohttp's,
    or app/webhook_http.py's fast path): signature, route, append, metrics, sampled refusal logs."""

    def __init__(self, settings: Settings, metrics: IngestMetrics, appender: Appender, refusals: SampledLog,
                 topics: TopicNames) -> None:
        self.settings = settings
        self.metrics = metrics
        self.appender = appender
        self.refusals = refusals
        self.topics = topics
        # per gateway: its adapter, the setting of its optional HTTP Basic auth, whether it is Batched;
        # looked up once (a missing module attribute costs about 0.4 µs a look, twice a request): the
        # registry is filled as its modules are imported and never changes while a process serves
        self._adapters: dict[str, tuple[Any, str | None, bool]] = {}

    def _adapter(self, gateway: str) -> tuple[Any, str | None, bool]:
        found = self._adapters.get(gateway)
        if found is None:
            entry = registry.find(gateway)
            assert entry is not None
            adapter: Any = entry.adapter  # its optional capabilities are looked up by name (Batched)
            found = self._adapters[gateway] = (adapter, getattr(adapter, "BASIC_AUTH_SETTING", None),
                                               hasattr(adapter, "split"))
        return found

    def serves(self, gateway: str) -> bool:
        """A gateway with an adapter and a secret: no secret, no way to prove a body is the gateway's."""
        return registry.find(gateway) is not None and bool(self.settings.secrets.get(gateway))

    async def webhook(self, gateway: str, raw: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        """(status, JSON body) for a body of a gateway this receiver serves; a refusal's body is a
        problem document (app/problem.py)."""
        metrics = self.metrics
        if encoded(headers):  # the fast path's: aiohttp's path refused it before reading (receive)
            metrics.requests.labels(gateway, OUTCOMES[415]).inc()
            return 415, problem_bytes(415, ENCODED_REASON)
        adapter, setting, batched = self._adapter(gateway)
        try:
            if setting is not None and (credential := getattr(self.settings, setting)) is not None:
                adapter.check_basic_auth(headers, credential.reveal())
            adapter.verify(raw, headers, self.settings.secrets[gateway].reveal(), time.time())
        except SignatureError as exc:
            metrics.requests.labels(gateway, "unauthorized").inc()
            metrics.signature_failures.labels(gateway).inc()
            # the reason only: never the headers (they carry the signature) nor the body
            self.refusals.log(logging.WARNING, (gateway, "unauthorized", exc.reason), "401 %s: %s", gateway,
                              exc.reason, extra={"gateway": gateway, "outcome": "unauthorized",
                                                 "reason": exc.reason})
            return 401, problem_bytes(401, exc.reason)

        if batched:
            return await self._parts(gateway, adapter, raw)
        route: Route = adapter.route(raw)
        delivery_id = next_delivery_id()
        headers_out = raw_headers(gateway, delivery_id, int(time.time() * 1000))
        try:
            if route.resource_key is None:
                return await self._quarantine(gateway, raw, route, delivery_id, headers_out)
            await self.appender.append(self.topics.raw, route.resource_key.encode(), raw, [*headers_out, CHECKED])
        except Unavailable as exc:
            metrics.requests.labels(gateway, "unavailable").inc()
            self.refusals.log(logging.WARNING, (gateway, "unavailable"), "503 %s: %s", gateway, exc,
                              extra={"gateway": gateway, "outcome": "unavailable", "delivery_id": delivery_id})
            return 503, problem_bytes(503, str(exc))
        metrics.child(metrics.requests, gateway, "stored").inc()
        return 200, orjson.dumps({"status": "stored", "delivery_id": delivery_id})

    async def _parts(self, gateway: str, adapter: Batched, raw: bytes) -> tuple[int, bytes]:
        """A body of several records (Adyen's notification items): every one appended under its own
        key, at once; the answer waits for all of them, and any one not stored makes it 503 (the
        gateway resends the request; the reducer's dedupe absorbs what was stored)."""
        metrics = self.metrics
        received_at = int(time.time() * 1000)
        appends: list[Coroutine[Any, Any, object]] = []
        for value, route in adapter.split(raw):
            # a part set aside gets an id from its bytes: the gateway's resend of the request (after a
            # 503) quarantines it again under the same id, one row in the quarantine table, not one more
            delivery_id = next_delivery_id() if route.resource_key is not None else part_id(gateway, value)
            headers_out = raw_headers(gateway, delivery_id, received_at)
            if route.resource_key is None:
                appends.append(self._quarantine(gateway, value, route, delivery_id, headers_out, request=False))
            else:
                appends.append(self.appender.append(self.topics.raw, route.resource_key.encode(), value,
                                                    [*headers_out, CHECKED]))
        failed = [r for r in await asyncio.gather(*appends, return_exceptions=True) if isinstance(r, BaseException)]
        if failed:
            unavailable = next((r for r in failed if isinstance(r, Unavailable)), None)
            if unavailable is None:
                raise failed[0]
            metrics.requests.labels(gateway, "unavailable").inc()
            self.refusals.log(logging.WARNING, (gateway, "unavailable"), "503 %s: %s", gateway, unavailable,
                              extra={"gateway": gateway, "outcome": "unavailable", "records": len(appends)})
            return 503, problem_bytes(503, str(unavailable))
        metrics.child(metrics.requests, gateway, "stored").inc()
        return 200, adapter.ACCEPTED

    async def _quarantine(self, gateway: str, raw: bytes, route: Route, delivery_id: str,
                          headers: list[tuple[str, bytes]], request: bool = True) -> tuple[int, bytes]:
        """Set ``raw`` aside (``request``: it is the whole request, counted as its outcome; else one
        part of a request the caller counts)."""
        reason = route.quarantine_reason or "unroutable"
        await self.appender.append(self.topics.quarantine, delivery_id.encode(), raw,
                                   quarantine_headers(headers, "ingest", reason, route.resource_hint))
        if request:
            self.metrics.requests.labels(gateway, "quarantined").inc()
        code = route.quarantine_code or "unroutable"
        self.metrics.quarantined.labels(gateway, code).inc()
        resource_id = route.resource_hint.split(":", 1)[-1] if route.resource_hint else None
        with bound(gateway=gateway, delivery_id=delivery_id, resource_id=resource_id):
            self.refusals.log(logging.WARNING, (gateway, "quarantined", code), "quarantined %s delivery %s: %s",
                              gateway, delivery_id, reason, extra={"outcome": "quarantined", "code": code,
                                                                   "reason": reason, "event_id": route.event_id})
        # 200: the gateway must not retry a body it will never make valid.
        return 200, orjson.dumps({"status": "stored", "quarantined": True, "reason": reason,
                                  "delivery_id": delivery_id})

    async def receive(self, request: web.Request) -> web.StreamResponse:
        """aiohttp's way in (every request the fast path hands over: chunked or slow bodies, Expect, ...)."""
        gateway = request.match_info["gateway"]
        if not self.serves(gateway):
            self.metrics.requests.labels("unknown", "not_found").inc()
            return refusal(404, f"unknown gateway {gateway!r}")
        try:
            if encoded(request.headers):  # before aiohttp decompresses a byte of it
                raise BodyRefused(415, ENCODED_REASON)
            raw = await read_body(request, MAX_BODY, self.settings.read_timeout_s)
        except BodyRefused as refused:
            self.metrics.requests.labels(gateway, OUTCOMES[refused.status]).inc()
            return await refuse_body(request, refused)
        try:
            status, body = await self.webhook(gateway, raw, request.headers)
        except Exception as exc:  # as the fast path does: a sampled traceback, not aiohttp's one per request
            log_unexpected(gateway, exc)
            return refusal(500, "internal error")
        return web.Response(status=status, body=body, content_type=PROBLEM if status >= 400 else "application/json")
