"""The ingest's fast path for webhook POSTs, in front of aiohttp's own HTTP protocol (I/O shell).

A connection starts here. While its requests are plain ``POST /webhooks/{gateway}`` ones of a gateway
the ingest serves, each arrived whole (headers and a Content-Length body), with nothing unusual in
them, they are answered by this protocol: the request head is split in C (bytes methods), the
receiver (app/ingest/receiver.py) decides, and the answer is written as bytes. aiohttp's web layer (its
request and response objects, router and handler machinery) was most of the ingest's CPU per
webhook (docs/benchmarks.md).

Anything else (another route, a body still arriving, chunked, ``Expect``, ``Upgrade``, HTTP/1.0, a
header that is not plain, a body over the limit, bytes that are not a request) hands the
connection, with every byte not yet answered, to aiohttp's protocol for the rest of its life, so
that every limit the ingest enforces (413 before HMAC, 408 for a slow body, the keep-alive timer
for slow headers, 400 for malformed requests) stays aiohttp's and the ingest's own. A request is
handed over only at a request boundary with no answer pending, so answers keep their order.

What this needs of aiohttp's internals (a site listening with our protocol, the hand-over of a live
connection) goes through app/seams/aiohttp.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from email.utils import formatdate
from typing import cast

from aiohttp import web
from multidict import CIMultiDict

from app.logs import SampledLog
from app.problem import CONTENT_TYPE, problem_bytes
from app.seams.aiohttp import ProtocolSite, hand_over

log = logging.getLogger("orderly.ingest")
# A request that makes the receiver raise is a bug, but one any client may repeat at will: its
# traceback is written at most 5 times a minute per gateway and exception type, not once per request.
UNEXPECTED = SampledLog(log, first=5, window_s=60.0)


def log_unexpected(gateway: str, exc: BaseException) -> None:
    """The traceback of an error answering a ``gateway`` webhook, sampled (UNEXPECTED); escaped, since
    its text may hold a header's bytes that are not UTF-8 (lone surrogates no log encoder takes)."""
    text = "".join(traceback.format_exception(exc)).encode("utf-8", "backslashreplace").decode("utf-8")
    UNEXPECTED.log(logging.ERROR, (gateway, type(exc).__name__), "unhandled error answering a %s webhook: %s",
                   gateway, text)

Receive = Callable[[str, bytes, Mapping[str, str]], Awaitable[tuple[int, bytes]]]

MAX_HEAD = 16 * 1024  # a head longer than this (or not complete yet) goes to aiohttp, which limits it
MAX_HEADERS = 100  # lines of a head (aiohttp refuses more than 128 headers)
MAX_LINE = 8190  # bytes of a header line (aiohttp's max_field_size)
MAX_NAME = 256  # bytes of a header name (llhttp counts two names together against MAX_LINE)
PREFIX = b"POST /webhooks/"
SUFFIX = b" HTTP/1.1"
PROBLEM = CONTENT_TYPE.encode()
INTERNAL_ERROR = problem_bytes(500, "internal error")
REASONS = {200: b"OK", 401: b"Unauthorized", 415: b"Unsupported Media Type", 500: b"Internal Server Error",
           503: b"Service Unavailable"}
# Headers that change how the request is framed or answered: their requests go to aiohttp.
# Control characters (but tab) and DEL, which llhttp refuses in a header value.
CONTROL = bytes((*range(0x09), *range(0x0A, 0x20), 0x7F))
# Proxy-Connection: aiohttp's parser reads it as Connection.
FRAMING = frozenset({"transfer-encoding", "expect", "upgrade", "te", "trailer", "http2-settings", "proxy-connection"})


class Head:
    """A fast-path request's head: what the receiver needs and where the request ends."""

    __slots__ = ("body_start", "close", "end", "gateway", "headers")

    def __init__(self, gateway: str, headers: CIMultiDict[str], body_start: int, end: int, close: bool) -> None:
        self.gateway = gateway
        self.headers = headers
        self.body_start = body_start
        self.end = end
        self.close = close


def parse_head(buf: bytes, gateways: frozenset[bytes], max_body: int, start: int = 0) -> Head | None:
    """The head of the request at ``start`` in ``buf`` if the fast path may answer it (its offsets are
    into ``buf``); None hands it (and the connection) to aiohttp. Strict on purpose: whatever is not
    plainly one whole request of the fast path's form is aiohttp's to judge, answer or refuse."""
    head_end = buf.find(b"\r\n\r\n", start, start + MAX_HEAD)
    if head_end < 0:
        return None
    head = buf[start:head_end]
    lines = head.split(b"\r\n")
    # No bare CR or LF: llhttp refuses them, and a framing ambiguity is a smuggling risk (the
    # request line is checked whole below; each header value for control characters). At most
    # MAX_HEADERS lines of at most MAX_LINE bytes, aiohttp's own limits.
    if head.count(b"\n") != len(lines) - 1 or head.count(b"\r") != len(lines) - 1 or len(lines) > MAX_HEADERS:
        return None
    request_line = lines[0]
    if not (request_line.startswith(PREFIX) and request_line.endswith(SUFFIX)):
        return None
    gateway = request_line[len(PREFIX):-len(SUFFIX)]
    if gateway not in gateways:
        return None
    headers: CIMultiDict[str] = CIMultiDict()
    length = -1
    close = False
    host = False
    seen: set[str] = set()
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        # no colon, or a name that is not letters, digits, '-' and '_' (white space before the colon,
        # an obs-fold continuation line, an empty name: aiohttp judges those)
        if not colon or len(name) > MAX_NAME or not name.replace(b"-", b"").replace(b"_", b"").isalnum():
            return None
        if len(value.translate(None, CONTROL)) != len(value) or len(line) > MAX_LINE:
            return None
        key = name.decode("ascii")
        text = value.strip(b" \t").decode("utf-8", "surrogateescape")  # as aiohttp decodes header values
        lower = key.lower()
        if lower in seen:
            return None  # a repeated header: aiohttp refuses some (Host, Content-Length, ...), keeps others
        seen.add(lower)
        if lower == "content-length":
            if not text.isascii() or not text.isdigit() or len(text) > 18:
                return None  # a length that is not plain digits (or longer than int() takes at once)
            length = int(text)
        elif lower == "connection":
            token = text.lower()
            if token == "close":
                close = True
            elif token != "keep-alive":
                return None
        elif lower == "host":
            host = True
        elif lower in FRAMING:
            return None
        headers.add(key, text)
    if length < 0 or length > max_body or not host:
        return None  # no length (or one over the limit: aiohttp answers 413 before reading it), no Host
    body_start = head_end + 4
    end = body_start + length
    if len(buf) < end:
        return None  # the body is still arriving: aiohttp reads it, with its deadline
    return Head(gateway.decode("ascii"), headers, body_start, end, close)


_date: tuple[int, bytes] = (0, b"")


def http_date() -> bytes:
    global _date
    second = int(time.time())
    if _date[0] != second:
        _date = (second, formatdate(second, usegmt=True).encode("ascii"))
    return _date[1]


def response(status: int, body: bytes, close: bool) -> bytes:
    """The answer's bytes: a refusal's body is a problem document (app/problem.py), typed so."""
    return b"".join((
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n"
        % (status, REASONS.get(status, b"Unknown"), PROBLEM if status >= 400 else b"application/json", len(body),
           http_date()),
        b"Connection: close\r\n\r\n" if close else b"\r\n", body))


class FastPath:
    """What a listening socket's connections share: the receiver, aiohttp's protocol factory for
    hand-overs, the open connections (for the idle timer and shutdown) and the hand-over count."""

    def __init__(self, receive: Receive, gateways: frozenset[str], fallback: web.Server, max_body: int,
                 keepalive_s: float, on_hand_over: Callable[[], None] = lambda: None) -> None:
        self.receive = receive
        self.gateways = frozenset(g.encode("ascii") for g in gateways)
        self.fallback = fallback
        self.max_body = max_body
        self.keepalive_s = keepalive_s
        self.on_hand_over = on_hand_over
        # a client that sends faster than it reads answers is paused past this much unanswered input
        self.max_buffer = 2 * max_body + MAX_HEAD
        self.connections: set[WebhookConnection] = set()
        self.closing = False
        self._sweeper: asyncio.Task[None] | None = None

    def __call__(self) -> WebhookConnection:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._close_idle())
        return WebhookConnection(self)

    async def _close_idle(self) -> None:
        """One timer for every connection instead of one per request: close those idle (no request
        pending) or not reading their answers for longer than the keep-alive limit, as aiohttp does."""
        while True:
            await asyncio.sleep(min(1.0, self.keepalive_s / 4))
            limit = time.monotonic() - self.keepalive_s
            for conn in list(self.connections):
                if conn.stalled_since is not None and conn.stalled_since < limit:
                    conn.close(abort=True)  # its answers are not read: a close would wait on them for ever
                elif conn.idle_since is not None and conn.idle_since < limit:
                    conn.close()

    async def shutdown(self, timeout_s: float) -> None:
        """Close idle connections now, the others once their answer is written (within ``timeout_s``)."""
        self.closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            if conn.idle_since is not None:
                conn.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (answering := [conn.task for conn in self.connections if conn.task is not None]) and (
                remaining := deadline - loop.time()) > 0:
            await asyncio.wait(answering, timeout=remaining)  # each closes its connection once written
        for conn in list(self.connections):
            conn.close(abort=True)


class WebhookConnection(asyncio.Protocol):
    """One connection, while it is the fast path's: requests answered one at a time, in order.

    The unanswered input is ``buffer[offset:]`` followed by ``arrived`` (chunks that came while an
    answer was being decided): a request is read in place, and chunks are joined only when the
    buffer holds no whole request, so no byte is copied again for every segment or request."""

    def __init__(self, path: FastPath) -> None:
        self.path = path
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.offset = 0
        self.arrived: list[bytes] = []
        self.arrived_bytes = 0
        self.task: asyncio.Task[None] | None = None  # the request being answered
        self.idle_since: float | None = time.monotonic()
        self.stalled_since: float | None = None  # when the client stopped reading its answers
        self.reading_paused = False
        self.eof = False  # the client will send no more
        self.gone = False  # closed, or handed over

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        if self.path.closing:
            self.transport.close()
            return
        self.path.connections.add(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        # An answer being decided goes on: its append completes, the gateway retries, the worker
        # calls the repeat a duplicate. Only its write is skipped.
        self.gone = True
        self.path.connections.discard(self)

    def unanswered(self) -> int:
        return len(self.buffer) - self.offset + self.arrived_bytes

    def data_received(self, data: bytes) -> None:
        if self.gone:
            return
        if self.task is None and self.stalled_since is None:
            if self.offset < len(self.buffer) or self.arrived:
                self.arrived.append(data)
                self.arrived_bytes += len(data)
            else:
                self.buffer, self.offset = data, 0
            self._next()
            return
        # Small segments are joined as they come (at most 4 KiB copied each): a list of one-byte
        # chunks would cost fifty times its bytes in memory before the pause below.
        if self.arrived and len(self.arrived[-1]) < 4096:
            self.arrived[-1] += data
        else:
            self.arrived.append(data)
        self.arrived_bytes += len(data)
        if self.unanswered() > self.path.max_buffer and not self.reading_paused:
            assert self.transport is not None
            self.transport.pause_reading()
            self.reading_paused = True

    def eof_received(self) -> bool | None:
        self.eof = True
        if self.task is None and not self.unanswered():
            return None  # nothing pending: the transport closes
        return True  # keep the transport open to answer what came first (then close: see _next)

    def pause_writing(self) -> None:
        self.stalled_since = time.monotonic()

    def resume_writing(self) -> None:
        self.stalled_since = None
        if self.task is None and not self.gone:
            self._next()

    def close(self, abort: bool = False) -> None:
        """Close (after the answers written so far are sent), or with ``abort`` at once."""
        if self.transport is not None and not self.gone:
            self.gone = True
            if abort or self.transport.get_write_buffer_size():
                self.transport.abort()  # what is left unsent would wait on a client that does not read
            else:
                self.transport.close()
            self.path.connections.discard(self)

    def _next(self) -> None:
        """Answer the request at the start of the unanswered input, or hand the connection over.
        Whatever goes wrong here closes the connection: none may be left open and unanswered."""
        try:
            self._answer_next()
        except Exception:
            log.exception("closing a webhook connection after an unexpected error")
            self.close()

    def _answer_next(self) -> None:
        path = self.path
        head = parse_head(self.buffer, path.gateways, path.max_body, self.offset)
        if head is None and self.arrived:
            self.buffer = b"".join([self.buffer[self.offset:], *self.arrived])
            self.offset, self.arrived, self.arrived_bytes = 0, [], 0
            head = parse_head(self.buffer, path.gateways, path.max_body)
        if head is None:
            if self.offset < len(self.buffer):
                self._hand_over()
                return
            self.buffer, self.offset = b"", 0
            self.idle_since = time.monotonic()
            if path.closing or self.eof:
                self.close()
            return
        raw = self.buffer[head.body_start:head.end]
        self.offset = head.end
        if self.reading_paused and self.unanswered() <= path.max_buffer:
            assert self.transport is not None
            self.transport.resume_reading()
            self.reading_paused = False
        self.idle_since = None
        self.task = asyncio.get_running_loop().create_task(self._answer(head, raw))

    async def _answer(self, head: Head, raw: bytes) -> None:
        close = head.close
        try:
            status, body = await self.path.receive(head.gateway, raw, head.headers)
        except Exception as exc:
            log_unexpected(head.gateway, exc)
            status, body, close = 500, INTERNAL_ERROR, True
        close = close or self.path.closing  # a shutdown that began while deciding: this is the last answer
        self.task = None
        if self.gone:
            return
        assert self.transport is not None
        self.transport.write(response(status, body, close))
        if close:
            self.close()
        elif self.stalled_since is None:
            self._next()

    def _hand_over(self) -> None:
        """Give the transport, and every byte not yet answered, to a fresh aiohttp protocol."""
        transport = self.transport
        assert transport is not None and self.task is None
        self.gone = True
        self.path.connections.discard(self)
        unanswered = b"".join([self.buffer[self.offset:], *self.arrived])
        self.buffer, self.offset, self.arrived = b"", 0, []
        try:
            self.path.on_hand_over()
            hand_over(self.path.fallback, transport, unanswered, writing_paused=self.stalled_since is not None,
                      reading_paused=self.reading_paused)
        except Exception:
            log.exception("closing a webhook connection whose hand-over to aiohttp failed")
            transport.abort()


class WebhookSite(ProtocolSite):
    """aiohttp's TCP site with the fast path in front of its protocol (see the module docstring):
    stopping it lets the fast path's answers in flight finish (their appends are acknowledged or time
    out) before the runner stops the producer."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, receive: Receive,
                 gateways: frozenset[str], max_body: int, keepalive_s: float,
                 on_hand_over: Callable[[], None] = lambda: None) -> None:
        assert runner.server is not None
        self.fast = FastPath(receive, gateways, runner.server, max_body, keepalive_s, on_hand_over)
        super().__init__(runner, host, port, protocol_factory=self.fast, drain=self.fast.shutdown)
