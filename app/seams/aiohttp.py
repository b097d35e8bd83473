"""The one door to aiohttp's internals (seam layer): a TCP site that listens with a protocol of our
own, and the hand-over of a live connection to aiohttp's HTTP protocol.

The ingest's fast path (app/webhook_http.py) answers plain webhook POSTs before aiohttp's web layer
sees them and hands every other connection to aiohttp's protocol. aiohttp has no public way to put a
protocol in front of its own, so this module relies on how aiohttp 3.14.5 (the version pinned in
app/seams/__init__.py and pyproject.toml) builds its sites, runners and protocols, each reliance
stated where it is used, from aiohttp/web_runner.py, web_server.py, web_protocol.py and
base_protocol.py. tests/unit/test_seams_aiohttp.py fails when any of it changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web


class ProtocolSite(web.TCPSite):
    """aiohttp's TCP site listening with ``protocol_factory`` instead of the runner's server.

    The runner still owns the site as one of its own: ``runner.sites`` and ``runner.addresses`` list
    it, ``site.port`` and ``site.name`` give the bound port, ``runner.cleanup()`` stops it. Stopping
    closes the listener, then awaits ``drain(timeout_s)`` (with the runner's shutdown timeout) so that
    the protocol's connections can finish, before aiohttp shuts its own connections down."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 protocol_factory: Callable[[], asyncio.BaseProtocol],
                 drain: Callable[[float], Awaitable[None]]) -> None:
        super().__init__(runner, host, port)
        # Our own copies of what TCPSite.__init__ stores in its private slots (_runner, _host, _port,
        # _backlog, _reuse_address, _reuse_port): start() listens as TCPSite.start would with them.
        self.runner = runner
        self.host = host
        self.requested_port = port
        self.protocol_factory = protocol_factory
        self.drain = drain

    async def start(self) -> None:
        # BaseSite.start (web_runner.py) only registers the site with its runner
        # (BaseRunner._reg_site): from then on runner.sites lists it and runner.cleanup() stops it.
        # TCPSite.start, skipped here, would then listen with runner.server as the protocol factory.
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        # TCPSite.start's create_server with TCPSite's defaults (no TLS, backlog 128, the platform's
        # reuse_address and reuse_port), and our protocol in place of runner.server.
        server = await loop.create_server(self.protocol_factory, self.host, self.requested_port, backlog=128,
                                          reuse_address=None, reuse_port=None)
        # BaseSite._server: BaseSite.stop closes it and BaseRunner.addresses lists its sockets.
        self._server = server
        # TCPSite._bound_port (added in the 3.14 series, aio-libs/aiohttp#12167): TCPSite.port and
        # TCPSite.name report it once set, the requested port (0 for any) until then. TCPSite.start
        # sets it the same way; without it this site would call itself port 0 when asked for any.
        self._bound_port = server.sockets[0].getsockname()[1] if server.sockets else self.requested_port

    async def stop(self) -> None:
        """Stop listening, let the protocol's connections finish (``drain``), then unregister."""
        if self._server is not None:
            self._server.close()
        await self.drain(shutdown_timeout(self.runner))
        # BaseSite.stop: checks the site is registered, closes _server again (a no-op), unregisters.
        await super().stop()


def shutdown_timeout(runner: web.BaseRunner) -> float:
    """The grace ``runner.cleanup()`` gives open connections to finish (``shutdown_timeout=``).

    BaseRunner keeps it in its private ``_shutdown_timeout`` slot (web_runner.py) and passes it to
    ``Server.shutdown`` in ``cleanup``; no public attribute holds it."""
    timeout: float = runner._shutdown_timeout
    return timeout


def hand_over(server: web.Server, transport: asyncio.Transport, unanswered: bytes, *, writing_paused: bool,
              reading_paused: bool) -> None:
    """Give a live connection, and the bytes it sent that nobody has answered yet, to a fresh aiohttp
    HTTP protocol, which serves it from then on as if it had accepted it.

    Relies on: ``Server.__call__`` (web_server.py) being the protocol factory TCPSite listens with,
    a new ``RequestHandler``; ``RequestHandler.connection_made`` (web_protocol.py) registering the
    connection with the server (so ``runner.cleanup()`` shuts it down with the rest), starting its
    keep-alive timer (a slow head is bounded) and its request loop on the transport it is given;
    ``BaseProtocol.pause_writing`` (base_protocol.py) only recording that writes must wait for
    ``resume_writing``; ``RequestHandler.data_received`` parsing whatever bytes it is fed."""
    handler = server()
    transport.set_protocol(handler)
    handler.connection_made(transport)
    if writing_paused:
        handler.pause_writing()  # the transport already paused us: it will call the new protocol's resume
    if reading_paused:
        transport.resume_reading()  # before the bytes: aiohttp pauses it again when its own queue fills
    handler.data_received(unanswered)


def close_connection(request: web.BaseRequest) -> None:
    """Close the request's connection now, without waiting for the rest of its body or the next
    request; what was already written (an answer prepared and ended) is still sent first.

    ``BaseRequest.protocol`` is the connection's ``RequestHandler`` (web_request.py);
    ``RequestHandler.force_close`` (web_protocol.py) marks it closing, wakes its request loop and
    closes the transport, which flushes what it holds before it closes (asyncio's ``close``)."""
    request.protocol.force_close()
