"""app/webhook_http.py's parse_head: whatever request head it accepts, aiohttp's own (llhttp) parser
reads the same way — method, path, headers, body, keep-alive — and whatever is unusual it leaves to
aiohttp (None)."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser
from hypothesis import given, settings
from hypothesis import strategies as st

from app.webhook_http import Head, parse_head

GATEWAYS = frozenset({b"pg", b"card", b"paymos"})
MAX_BODY = 1024


def request(head_lines: list[bytes], body: bytes = b"", sep: bytes = b"\r\n") -> bytes:
    return sep.join(head_lines) + sep + sep + body


def plain(body: bytes = b'{"a":1}', *extra: bytes, gateway: bytes = b"pg") -> bytes:
    return request([b"POST /webhooks/" + gateway + b" HTTP/1.1", b"Host: x",
                    b"Content-Length: %d" % len(body), *extra], body)


def aiohttp_reads(data: bytes) -> list[tuple[object, bytes]]:
    """(message, body) of every request aiohttp's parser finds in ``data``."""
    async def parse() -> list[tuple[object, bytes]]:
        parser = HttpRequestParser(mock.Mock(_reading_paused=False), asyncio.get_running_loop(), 2 ** 16)
        messages, _, _ = parser.feed_data(data)
        return [(message, payload.read_nowait()) for message, payload in messages]

    return asyncio.run(parse())


def agrees_with_aiohttp(data: bytes, head: Head) -> None:
    (message, body), = aiohttp_reads(data[:head.end])
    assert message.method == "POST"  # type: ignore[attr-defined]
    assert message.path == f"/webhooks/{head.gateway}"  # type: ignore[attr-defined]
    assert message.version == (1, 1)  # type: ignore[attr-defined]
    # the same names (aiohttp spells the ones it knows its own way: they are compared case-blind), values, order
    assert [(k.lower(), v) for k, v in message.headers.items()] == [  # type: ignore[attr-defined]
        (k.lower(), v) for k, v in head.headers.items()]
    assert message.should_close == head.close  # type: ignore[attr-defined]
    assert not message.chunked and not message.upgrade  # type: ignore[attr-defined]
    assert body == data[head.body_start:head.end]


def test_a_plain_webhook_is_the_fast_paths() -> None:
    data = plain(b'{"a":1}', b"PG-Signature: t=1,v1=ab")
    head = parse_head(data, GATEWAYS, MAX_BODY)
    assert head is not None and head.gateway == "pg" and not head.close
    assert head.headers["pg-signature"] == "t=1,v1=ab" and data[head.body_start:head.end] == b'{"a":1}'
    agrees_with_aiohttp(data, head)


def test_pipelined_requests_end_where_the_first_body_ends() -> None:
    first, second = plain(b"one"), plain(b"second", gateway=b"card")
    head = parse_head(first + second, GATEWAYS, MAX_BODY)
    assert head is not None and head.end == len(first)
    rest = parse_head((first + second)[head.end:], GATEWAYS, MAX_BODY)
    assert rest is not None and rest.gateway == "card"


def test_connection_close_is_kept() -> None:
    head = parse_head(plain(b"x", b"Connection: close"), GATEWAYS, MAX_BODY)
    assert head is not None and head.close


@pytest.mark.parametrize("data", [
    plain(gateway=b"unknown"),  # aiohttp answers 404
    plain(gateway=b"pg?x=1"),  # a query: aiohttp's router
    plain()[:-1],  # the body still arriving
    plain()[:20],  # the head still arriving
    plain().replace(b"POST", b"PUT"),
    plain().replace(b"HTTP/1.1", b"HTTP/1.0"),
    plain(b"x", b"Transfer-Encoding: chunked"),
    plain(b"x", b"Expect: 100-continue"),
    plain(b"x", b"Upgrade: websocket"),
    plain(b"x", b"Connection: upgrade"),
    plain(b"x", b"Content-Length: 1"),  # two lengths
    plain(b"x", b"X-Folded: a", b" b"),  # obs-fold
    plain(b"x", b"X-Space : a"),  # white space before the colon
    plain(b"x", b"X-Nul: a\x00b"),
    plain(b"x", b"X-Bare: a\rb"),
    plain(b"x", b"No colon"),
    request([b"POST /webhooks/pg HTTP/1.1", b"Host: x", b"Content-Length: 1"], b"x", sep=b"\n"),  # bare LF
    request([b"POST /webhooks/pg HTTP/1.1", b"Host: x", b"Content-Length: +1"], b"x"),
    request([b"POST /webhooks/pg HTTP/1.1", b"Host: x", b"Content-Length: \xd9\xa1"], b"x"),  # a non-ASCII digit
    request([b"POST /webhooks/pg HTTP/1.1", b"Host: x"], b""),  # no length
    request([b"POST /webhooks/pg HTTP/1.1", b"Content-Length: 1"], b"x"),  # no Host (llhttp refuses it)
    request([b"POST /webhooks/pg HTTP/1.1", b"Host: x", b"Content-Length: %d" % (MAX_BODY + 1)], b"x" * (MAX_BODY + 1)),
    b"x" * 20_000,  # no head within the limit
    plain(b"x", b"Content-Length: " + b"0" * 5000 + b"1"),  # past int()'s digit limit
    plain(b"x", *(b"X-H%d: v" % i for i in range(120))),  # more headers than aiohttp takes
    plain(b"x", b"X-Long: " + b"v" * 9000),  # a line longer than aiohttp takes
    plain(b"x", b"Proxy-Connection: close"),  # aiohttp reads it as Connection
    plain(b"x", b"X" * 4100 + b": a", b"Y" * 4100 + b": b"),  # llhttp counts two names together
])
def test_anything_unusual_is_aiohttps(data: bytes) -> None:
    assert parse_head(data, GATEWAYS, MAX_BODY) is None


TOKEN = st.text(st.sampled_from("abcXYZ-_09"), min_size=1, max_size=12)
PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)
NASTY_LINES = st.sampled_from([
    b"Content-Length: 3", b"content-length: 0", b"Transfer-Encoding: chunked", b"Connection: close",
    b"Connection: keep-alive", b"Connection: Upgrade", b"Expect: 100-continue", b"Upgrade: h2c", b"X Space: a",
    b"X-Colon:: a", b": empty", b"\xc3\x9cml: a", b"X-Tab\t: a", b" Lead: a", b"X-Utf8: \xc3\xa9t\xc3\xa9",
    b"X-Bad: \xff\xfe", b"X-Del: a\x7fb", b"X-Ctl: a\x01b", b"X-Ctl: a\x0bb", b"Host: y", b"X-Empty:",
    b"X-Trailing: a \t ", b"X-NoColon", b"\tfolded"])
REQUEST_LINES = st.sampled_from([
    b"POST /webhooks/pg HTTP/1.0", b"POST  /webhooks/pg HTTP/1.1", b"POST /webhooks/pg/ HTTP/1.1",
    b"post /webhooks/pg HTTP/1.1", b"POST /webhooks/pg HTTP/1.1 ", b"POST /webhooks/pg%20 HTTP/1.1"])


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """Mostly plain webhook requests (which the fast path takes), with a few of the mutations a
    hostile or broken sender makes: odd header lines, request lines, lengths, line ends, trailing bytes."""
    body = draw(st.binary(max_size=40))
    gateway = draw(st.sampled_from([b"pg", b"card", b"paymos"]))
    lines = [b"POST /webhooks/" + gateway + b" HTTP/1.1", b"Host: x", b"Content-Length: %d" % len(body)]
    for _ in range(draw(st.integers(0, 5))):
        lines.append(draw(TOKEN).encode() + draw(st.sampled_from([b": ", b":", b":\t"])) + draw(PRINTABLE).encode())
    for _ in range(draw(st.integers(0, 2))):
        mutation = draw(st.sampled_from(["line", "request", "length", "drop"]))
        if mutation == "line":
            lines.insert(draw(st.integers(1, len(lines))), draw(NASTY_LINES))
        elif mutation == "request":
            lines[0] = draw(REQUEST_LINES)
        elif mutation == "length":
            lines = [line for line in lines if not line.startswith(b"Content-Length")]
            lines.append(b"Content-Length: " + draw(st.sampled_from([b"%d" % (len(body) + 1), b" 1", b"01", b"-0",
                                                                   b"1 1", b"0x1", b"99999999999999999999"])))
        elif len(lines) > 1:
            del lines[draw(st.integers(1, len(lines) - 1))]
    sep = b"\n" if draw(st.integers(0, 9)) == 0 else b"\r\n"
    trailing = draw(st.sampled_from([b"", b"", b"POST", b"\r\n", b"GET / HTTP/1.1\r\n\r\n"]))
    return request(lines, body, sep=sep) + trailing


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=30), requests())
def test_a_request_further_in_the_buffer_reads_the_same(before: bytes, data: bytes) -> None:
    here, there = parse_head(data, GATEWAYS, MAX_BODY), parse_head(before + data, GATEWAYS, MAX_BODY, len(before))
    assert (here is None) == (there is None)
    if here is not None and there is not None:
        assert (there.body_start - len(before), there.end - len(before)) == (here.body_start, here.end)
        assert (there.gateway, list(there.headers.items()), there.close) == (
            here.gateway, list(here.headers.items()), here.close)


@settings(max_examples=400, deadline=None)
@given(requests())
def test_what_the_fast_path_accepts_aiohttp_reads_the_same(data: bytes) -> None:
    head = parse_head(data, GATEWAYS, MAX_BODY)
    if head is None:
        return
    try:
        agrees_with_aiohttp(data, head)
    except HttpProcessingError as exc:
        raise AssertionError(f"the fast path took a request aiohttp refuses: {exc!r}") from exc
