"""Reading a request body within its size and time limits, and answering one refused (I/O shell)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from multidict import MultiMapping

from app.ingest.answers import refusal
from app.seams.aiohttp import close_connection

MAX_BODY = 1024 * 1024  # 1 MiB; larger bodies are refused before any HMAC work
OUTCOMES = {400: "bad_request", 408: "timeout", 413: "too_large", 415: "encoded"}  # a refusal's metric outcome
# One body, one stored byte string whatever the framing: aiohttp decompresses a gzip, deflate or br
# body as it reads it (a chunked or Expect request), the fast path would store the bytes as sent, and
# the signature is over the bytes as sent. Gateways never compress webhooks, so a body with any
# Content-Encoding but identity is refused with 415 on every path, before it is read.
ENCODED_REASON = "Content-Encoding other than identity is not accepted: send the body as is"


class BodyRefused(Exception):
    """The request body cannot be taken: too large (413), not arrived in time (408), malformed (400)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, at most ``limit`` bytes, arrived within ``timeout_s``; else BodyRefused.

    A sender that announces a longer Content-Length than it sends (or stops mid-chunk) would
    otherwise hold its socket and a handler for ever, so the wait has a deadline.
    """
    too_large = BodyRefused(413, f"body over {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large  # before reading a byte of it
    content = request.content
    chunks: list[bytes] = []
    size = 0
    try:
        if content.is_eof():  # the whole body came with the headers (the usual case): nothing to wait for
            whole = content.read_nowait()
            if len(whole) > limit:
                raise too_large
            return whole
        async with asyncio.timeout(timeout_s):
            while chunk := await content.readany():
                size += len(chunk)
                if size > limit:  # a chunked body announces no length
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise BodyRefused(408, f"the body did not arrive within {timeout_s:g} s") from None
    except HttpProcessingError as exc:  # e.g. a malformed chunk
        raise BodyRefused(400, f"malformed body: {exc.message}") from None
    except ConnectionError:
        raise BodyRefused(400, "the connection closed before the body arrived") from None
    return b"".join(chunks)


async def refuse_body(request: web.Request, refused: BodyRefused) -> web.StreamResponse:
    """Answer a refused body and close the connection: the rest of the body may never come, and
    waiting to drain it (aiohttp lingers up to 10 s) would keep the socket the timeout freed."""
    resp = refusal(refused.status, refused.reason)
    resp.force_close()
    if refused.status == 408:
        await resp.prepare(request)
        await resp.write_eof()
        close_connection(request)  # after the answer is written: the transport flushes it first
    return resp


def encoded(headers: Mapping[str, str]) -> bool:
    """True when the request's body is sent with a content coding other than identity (any of its
    Content-Encoding headers, any coding listed in one)."""
    values = headers.getall("Content-Encoding", ()) if isinstance(headers, MultiMapping) else (
        [headers["Content-Encoding"]] if "Content-Encoding" in headers else [])
    return any(coding.strip().lower() not in ("", "identity") for value in values for coding in value.split(","))
