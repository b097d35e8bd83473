"""app/webhook_http.py's connections on a loopback socket, with a receiver the test controls and a
small aiohttp app behind them: answers in order, one request at a time, the hand-over to aiohttp at a
request boundary, keep-alive and close, flow control, and shutdown finishing the answers in flight.
Run on both loops the processes may use (asyncio and uvloop)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvloop
from aiohttp import web

from app.webhook_http import UNEXPECTED, WebhookSite, log_unexpected


class Receiver:
    """Records what it was given; answers at once unless ``gate`` is set, then when it opens."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.active = 0
        self.most_active = 0
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def __call__(self, gateway: str, raw: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        self.seen.append(raw)
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.fail:
                raise RuntimeError("boom")
            return 200, b'{"fast":"%s"}' % raw
        finally:
            self.active -= 1


async def fallback(request: web.Request) -> web.Response:
    body = await request.read()
    return web.Response(text=f"aiohttp {request.method} {request.path} {body.decode()}")


@asynccontextmanager
async def served(receiver: Receiver, keepalive_s: float = 30.0, on_hand_over: Callable[[], None] | None = None,
                 ) -> AsyncIterator[tuple[int, WebhookSite, list[int]]]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fallback)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=keepalive_s, shutdown_timeout=5)
    await runner.setup()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    handed_over: list[int] = []
    site = WebhookSite(runner, "127.0.0.1", port, receive=receiver, gateways=frozenset({"pg"}), max_body=64 * 1024,
                       keepalive_s=keepalive_s, on_hand_over=on_hand_over or (lambda: handed_over.append(1)))
    await site.start()
    try:
        yield port, site, handed_over
    finally:
        await runner.cleanup()


@asynccontextmanager
async def client(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()  # left open, uvloop's loop refuses to close


def webhook(body: bytes, *extra: bytes) -> bytes:
    return b"\r\n".join([b"POST /webhooks/pg HTTP/1.1", b"Host: x", b"Content-Length: %d" % len(body), *extra,
                         b"", body])


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status_line, *lines = head.decode().split("\r\n")[:-2]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    return int(status_line.split()[1]), headers, body


def on_each_loop(scenario: Callable[[], Any]) -> Callable[[str], None]:
    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def test(loop: str) -> None:
        if loop == "uvloop":
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(scenario())
        else:
            asyncio.run(scenario())

    test.__name__ = scenario.__name__
    test.__doc__ = scenario.__doc__
    return test  # the scenario under its own name, run once on each loop


@on_each_loop
async def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    receiver = Receiver()
    async with served(receiver) as (port, _, handed_over):
        async with client(port) as (reader, writer):
            writer.write(webhook(b"1") + webhook(b"22") + webhook(b"333"))
            answers = [await read_answer(reader) for _ in range(3)]
            assert [a[2] for a in answers] == [b'{"fast":"1"}', b'{"fast":"22"}', b'{"fast":"333"}']
            assert all(a[0] == 200 and a[1]["content-type"] == "application/json" for a in answers)
            assert "connection" not in answers[0][1] and "date" in answers[0][1]
            assert receiver.most_active == 1 and not handed_over



@on_each_loop
async def test_another_route_goes_to_aiohttp_after_the_answer_in_flight() -> None:
    receiver = Receiver()
    receiver.gate = asyncio.Event()
    async with served(receiver) as (port, _, handed_over):
        async with client(port) as (reader, writer):
            # the second request arrives while the first is being decided: aiohttp must not answer it first
            writer.write(webhook(b"first") + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.sleep(0.2)
            assert not handed_over
            receiver.gate.set()
            assert (await read_answer(reader))[2] == b'{"fast":"first"}'
            assert (await read_answer(reader))[2] == b"aiohttp GET /healthz "
            # the connection stays aiohttp's: even a plain webhook is now answered there
            writer.write(webhook(b"later"))
            assert (await read_answer(reader))[2] == b"aiohttp POST /webhooks/pg later"
            assert handed_over == [1] and receiver.seen == [b"first"]



@on_each_loop
async def test_a_body_still_arriving_is_read_by_aiohttp() -> None:
    receiver = Receiver()
    async with served(receiver) as (port, _, handed_over):
        async with client(port) as (reader, writer):
            request = webhook(b"split body")
            writer.write(request[:-4])
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(request[-4:])
            assert (await read_answer(reader))[2] == b"aiohttp POST /webhooks/pg split body"
            writer.write(b"POST /webhooks/pg HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"3\r\nabc\r\n0\r\n\r\n")
            assert (await read_answer(reader))[2] == b"aiohttp POST /webhooks/pg abc"
            assert handed_over == [1] and receiver.seen == []



@on_each_loop
async def test_connection_close_and_end_of_input_close_after_the_answer() -> None:
    receiver = Receiver()
    async with served(receiver) as (port, _, _):
        async with client(port) as (reader, writer):
            writer.write(webhook(b"x", b"Connection: close"))
            status, headers, body = await read_answer(reader)
            assert (status, headers["connection"], body) == (200, "close", b'{"fast":"x"}')
            assert await asyncio.wait_for(reader.read(), 5) == b""
        async with client(port) as (reader, writer):
            writer.write(webhook(b"y"))
            writer.write_eof()  # the sender will send no more, but still reads its answer
            assert (await read_answer(reader))[2] == b'{"fast":"y"}'
            assert await asyncio.wait_for(reader.read(), 5) == b""



@on_each_loop
async def test_an_idle_connection_is_closed_after_the_keepalive_limit() -> None:
    receiver = Receiver()
    async with served(receiver, keepalive_s=0.4) as (port, site, _):
        async with client(port) as (reader, writer):
            writer.write(webhook(b"x"))
            await read_answer(reader)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server, well within 5 s
            assert not site.fast.connections



@on_each_loop
async def test_a_receiver_error_is_a_500_and_the_connection_closes() -> None:
    receiver = Receiver()
    receiver.fail = True
    async with served(receiver) as (port, _, _):
        async with client(port) as (reader, writer):
            writer.write(webhook(b"x") + webhook(b"never"))
            status, headers, _ = await read_answer(reader)
            assert (status, headers["connection"]) == (500, "close")
            assert await asyncio.wait_for(reader.read(), 5) == b""
            assert receiver.seen == [b"x"]



@on_each_loop
async def test_a_sender_that_outruns_its_answers_is_paused_not_buffered() -> None:
    receiver = Receiver()
    receiver.gate = asyncio.Event()
    async with served(receiver) as (port, site, _):
        async with client(port) as (reader, writer):
            body = b"b" * 60_000
            count = 8  # 480 kB of requests while the first one waits: past the 2 x 64 KiB + head bound
            for _ in range(count):
                writer.write(webhook(body))
            await asyncio.sleep(0.5)
            (conn,) = site.fast.connections
            assert conn.reading_paused and conn.unanswered() <= 2 * site.fast.max_buffer
            receiver.gate.set()
            answers = [await read_answer(reader) for _ in range(count)]
            assert all(status == 200 for status, _, _ in answers) and len(receiver.seen) == count
            assert not conn.reading_paused



@on_each_loop
async def test_shutdown_finishes_the_answer_in_flight_then_closes() -> None:
    receiver = Receiver()
    receiver.gate = asyncio.Event()
    async with served(receiver) as (port, site, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(webhook(b"in flight"))
        await asyncio.sleep(0.1)
        stopping = asyncio.ensure_future(site.stop())
        await asyncio.sleep(0.2)
        assert not stopping.done()  # waits for the answer being decided
        assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # an idle connection is closed at once
        receiver.gate.set()
        status, headers, body = await read_answer(reader)
        assert (status, headers["connection"], body) == (200, "close", b'{"fast":"in flight"}')
        await asyncio.wait_for(stopping, 5)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)  # no longer listening
        writer.close()
        idle_writer.close()



@on_each_loop
async def test_a_hand_over_while_reading_is_paused_keeps_the_order() -> None:
    receiver = Receiver()
    receiver.gate = asyncio.Event()
    async with served(receiver) as (port, site, handed_over):
        async with client(port) as (reader, writer):
            body = b"b" * 60_000
            for _ in range(4):
                writer.write(webhook(body))
            writer.write(b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n" + webhook(b"tail"))
            await asyncio.sleep(0.3)
            (conn,) = site.fast.connections
            assert conn.reading_paused
            receiver.gate.set()
            answers = [await read_answer(reader) for _ in range(6)]
            assert [a[2] for a in answers[4:]] == [b"aiohttp GET /after ", b"aiohttp POST /webhooks/pg tail"]
            assert handed_over == [1] and len(receiver.seen) == 4



@on_each_loop
async def test_a_client_that_stops_reading_is_closed_after_the_keepalive_limit() -> None:
    receiver = Receiver()
    async with served(receiver, keepalive_s=0.4) as (port, site, _):
        async with client(port) as (reader, writer):
            writer.write(webhook(b"x"))
            await read_answer(reader)
            (conn,) = site.fast.connections
            conn.pause_writing()  # as the transport does when the client's unread answers fill its buffer
            writer.write(webhook(b"waits"))
            assert await asyncio.wait_for(reader.read(), 5) == b""
            assert receiver.seen == [b"x"] and not site.fast.connections



@on_each_loop
async def test_a_content_length_too_long_for_int_is_aiohttps_to_refuse() -> None:
    receiver = Receiver()
    async with served(receiver) as (port, _, handed_over):
        async with client(port) as (reader, writer):
            writer.write(webhook(b"ok"))
            await read_answer(reader)
            writer.write(b"POST /webhooks/pg HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"0" * 5000 + b"1\r\n\r\nz")
            status, _, body = await read_answer(reader)
            assert (status, body) == (200, b"aiohttp POST /webhooks/pg z")  # llhttp reads the leading zeros
            assert handed_over == [1]



@on_each_loop
async def test_segments_that_come_while_deciding_are_kept_not_copied_each_time() -> None:
    receiver = Receiver()
    receiver.gate = asyncio.Event()
    async with served(receiver) as (port, site, _):
        async with client(port) as (reader, writer):
            writer.write(webhook(b"first"))
            await asyncio.sleep(0.1)
            (conn,) = site.fast.connections
            buffer = conn.buffer
            for byte in webhook(b"second")[:40]:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.003)
            await asyncio.sleep(0.1)
            # kept apart from the buffer (small segments joined as they came), joined to it once, when read
            assert conn.buffer is buffer and b"".join(conn.arrived) == webhook(b"second")[:40]
            writer.write(webhook(b"second")[40:])
            await writer.drain()
            await asyncio.sleep(0.1)  # the whole second request is in before the first answer is written
            receiver.gate.set()
            assert [(await read_answer(reader))[2] for _ in range(2)] == [b'{"fast":"first"}', b'{"fast":"second"}']



@on_each_loop
async def test_a_failed_hand_over_closes_the_connection() -> None:
    def broken() -> None:
        raise RuntimeError("hand-over failed")

    async with served(Receiver(), on_hand_over=broken) as (port, site, _):
        async with client(port) as (reader, writer):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, not left open without a timer
            assert not site.fast.connections



async def test_an_error_answering_is_logged_sampled_and_escaped(caplog: pytest.LogCaptureFixture) -> None:
    """A 500 any client can repeat writes its traceback at most 5 times a minute, not once per request
    (issue #45: a header byte that is not UTF-8 wrote a full traceback per request), and a lone
    surrogate in the error's text is escaped."""
    UNEXPECTED._windows.clear()
    with caplog.at_level("ERROR", logger="orderly.ingest"):
        for _ in range(50):
            try:
                "msg_\udcff".encode()
            except UnicodeEncodeError as exc:
                log_unexpected("card", exc)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5 and all("UnicodeEncodeError" in line and "\\udcff" in line for line in lines)
    assert all(line.encode() for line in lines)  # no lone surrogate left: every encoder takes it
