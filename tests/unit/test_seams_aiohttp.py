"""app/seams/aiohttp.py against the installed aiohttp: fails loudly when aiohttp changes under the seam.

Three layers: every private slot and method the seam touches exists with the shape it expects; the
source of each upstream function whose behaviour the seam relies on (or copies) is the one it was
read against (a digest: a change means re-reading that function against the seam, then updating
it here); and the fast site, behind a real runner on a loopback socket, starts, answers, reports
its bound port, hands a connection to aiohttp and shuts down with the runner, on both loops."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import pytest
import uvloop
from aiohttp import web, web_protocol, web_request
from aiohttp.base_protocol import BaseProtocol

from app.seams.aiohttp import ProtocolSite, close_connection, hand_over, shutdown_timeout
from app.webhook_http import WebhookSite

# What the seam relies on, each with the digest of its source in aiohttp 3.14.5.
RELIED_ON: dict[str, tuple[Callable[..., Any], str]] = {
    # ProtocolSite.start does what TCPSite.start does, with our protocol, and sets what it sets
    "TCPSite.start": (web.TCPSite.start, "0baaeca3d4f956ad"),
    "TCPSite.__init__": (web.TCPSite.__init__, "187427d7bba5ada2"),
    "TCPSite.port": (web.TCPSite.port.fget, "85f69652317a76d3"),  # type: ignore[attr-defined]
    "BaseSite.start": (web.BaseSite.start, "8dcebeed1ae05654"),  # only registers the site
    "BaseSite.stop": (web.BaseSite.stop, "c92f18307773ff03"),  # closes _server, unregisters
    "BaseRunner.addresses": (web.BaseRunner.addresses.fget, "3ed54ce3769cb77e"),  # type: ignore[attr-defined]
    "BaseRunner.cleanup": (web.BaseRunner.cleanup, "a53a459c698cb522"),  # sites stopped, then _shutdown_timeout
    # hand_over: a fresh RequestHandler adopts a live transport
    "Server.__call__": (web.Server.__call__, "c5700549e688b164"),
    "RequestHandler.connection_made": (web_protocol.RequestHandler.connection_made, "44d50b5763b2c7e4"),
    "RequestHandler.data_received": (web_protocol.RequestHandler.data_received, "1ee57ebe052e6c80"),
    "BaseProtocol.pause_writing": (BaseProtocol.pause_writing, "e727e6c57a46116e"),
    # close_connection
    "BaseRequest.protocol": (web_request.BaseRequest.protocol.fget, "b78e0ccb715b9bae"),  # type: ignore[attr-defined]
    "RequestHandler.force_close": (web_protocol.RequestHandler.force_close, "38d0e1e798e4d3b7"),
}


def digest(function: Callable[..., Any]) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def test_the_upstream_code_the_seam_relies_on_is_the_code_it_was_read_against() -> None:
    changed = [f"aiohttp's {name} changed (digest {digest(function)}): re-read it against app/seams/aiohttp.py, "
               f"then record its new digest here" for name, (function, known) in RELIED_ON.items()
               if digest(function) != known]
    assert not changed, "\n".join(changed)


def test_the_private_slots_the_seam_touches_exist() -> None:
    assert "_server" in web.BaseSite.__slots__  # written by ProtocolSite.start
    assert "_bound_port" in web.TCPSite.__slots__  # written by ProtocolSite.start
    assert "_shutdown_timeout" in web.BaseRunner.__slots__  # read by shutdown_timeout
    # ProtocolSite's own attributes shadow nothing of TCPSite's
    for name in ("runner", "host", "requested_port", "protocol_factory", "drain"):
        assert not hasattr(web.TCPSite, name), name


def parameters(function: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_signatures_the_seam_calls_are_the_expected_ones() -> None:
    positional, keyword, empty = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY, \
        inspect.Parameter.empty
    assert parameters(web.TCPSite.__init__) == [
        ("self", positional, empty), ("runner", positional, empty), ("host", positional, None),
        ("port", positional, None), ("shutdown_timeout", keyword, 60.0), ("ssl_context", keyword, None),
        ("backlog", keyword, 128), ("reuse_address", keyword, None), ("reuse_port", keyword, None)]
    for method in (web.BaseSite.start, web.BaseSite.stop, web.Server.__call__, BaseProtocol.pause_writing,
                   web_protocol.RequestHandler.force_close):
        assert parameters(method) == [("self", positional, empty)], method
    assert inspect.signature(web.Server.__call__).return_annotation in ("RequestHandler",
                                                                          web_protocol.RequestHandler)
    assert parameters(web_protocol.RequestHandler.connection_made) == [("self", positional, empty),
                                                                       ("transport", positional, empty)]
    assert parameters(web_protocol.RequestHandler.data_received) == [("self", positional, empty),
                                                                     ("data", positional, empty)]
    assert isinstance(inspect.getattr_static(web_request.BaseRequest, "protocol"), property)
    assert issubclass(web_protocol.RequestHandler, asyncio.Protocol)


def on_each_loop(scenario: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[str], None]:
    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def test(loop: str) -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None) as runner:
            runner.run(scenario())

    test.__name__ = scenario.__name__
    test.__doc__ = scenario.__doc__
    return test


async def answer(gateway: str, raw: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
    return 200, b'{"fast":"%s"}' % raw


async def aiohttp_route(request: web.Request) -> web.StreamResponse:
    resp = web.Response(text=f"aiohttp {request.method} {request.path}")
    if request.path == "/close":  # as the ingest refuses a slow body: the answer written, then closed
        await resp.prepare(request)
        await resp.write_eof()
        close_connection(request)
    return resp


async def exchange(port: int, request: bytes) -> bytes:
    """What the server sends back until it closes (``Connection: close`` or close_connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


@on_each_loop
async def test_the_fast_site_starts_answers_reports_its_port_hands_over_and_shuts_down() -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", aiohttp_route)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2)
    await runner.setup()
    site = WebhookSite(runner, "127.0.0.1", 0, receive=answer, gateways=frozenset({"pg"}), max_body=1024,
                       keepalive_s=5)
    assert site.port == 0  # the requested port, until it listens
    try:
        await site.start()
        port = site.port
        assert port != 0 and runner.addresses == [("127.0.0.1", port)]
        assert site.name == f"http://127.0.0.1:{port}" and site in runner.sites
        # the fast path answers a webhook, then hands the same connection's next request to aiohttp
        got = await exchange(port, b"POST /webhooks/pg HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
                                   b"GET /next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        first, _, second = got.partition(b'{"fast":"hi"}')
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and second.startswith(b"HTTP/1.1 200 OK\r\n")
        assert second.endswith(b"aiohttp GET /next")
        # close_connection: the answer written before it arrives whole, then the connection closes
        closed = await exchange(port, b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
        assert closed.startswith(b"HTTP/1.1 200 OK\r\n") and closed.endswith(b"aiohttp GET /close")
    finally:
        await runner.cleanup()
    assert site not in runner.sites
    with pytest.raises(OSError):
        await exchange(port, b"")


@on_each_loop
async def test_stopping_drains_with_the_runners_shutdown_timeout_before_unregistering() -> None:
    runner = web.AppRunner(web.Application(), access_log=None, shutdown_timeout=3.5)
    await runner.setup()
    drained: list[tuple[float, bool]] = []

    async def drain(timeout_s: float) -> None:
        drained.append((timeout_s, site in runner.sites))

    site = ProtocolSite(runner, "127.0.0.1", 0, protocol_factory=asyncio.Protocol, drain=drain)
    assert shutdown_timeout(runner) == 3.5
    await site.start()
    await runner.cleanup()
    assert drained == [(3.5, True)] and site not in runner.sites


@on_each_loop
async def test_a_handed_over_connection_is_served_by_aiohttp_from_its_first_byte() -> None:
    """hand_over alone: a connection accepted by a bare protocol is given, with bytes it already
    read, to the runner's aiohttp server, which answers them."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", aiohttp_route)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2)
    await runner.setup()
    assert runner.server is not None
    server = runner.server

    class Takes(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            hand_over(server, self.transport, data, writing_paused=False,  # type: ignore[arg-type]
                      reading_paused=False)

    site = ProtocolSite(runner, "127.0.0.1", 0, protocol_factory=Takes, drain=lambda _: asyncio.sleep(0))
    try:
        await site.start()
        got = await exchange(site.port, b"GET /handed HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 200 OK\r\n") and got.endswith(b"aiohttp GET /handed")
    finally:
        await runner.cleanup()
