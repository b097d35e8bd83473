"""The effects worker's HTTP client against a merchant on a loopback port (issue #45, item 5): no
redirect followed (a 307 re-sent the signed body and its Idempotency-Key to wherever it pointed, and
the 2xx there marked the effect delivered), a refusing answer read only up to ANSWER_BYTES, and
ORDERLY_EFFECTS_URL over https unless it is a loopback address or ORDERLY_EFFECTS_ALLOW_HTTP is set;
each request's deadline ORDERLY_EFFECTS_TIMEOUT_S."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from app.effects import ANSWER_BYTES, EffectsWorker, delivery_key
from app.settings import Secret, Settings, SettingsError
from tests.support import make_settings

SECRET = "whsec_ZGV2LWVmZmVjdHMtc2lnbmluZy1zZWNyZXQ="
ROW = {"dedupe_key": "deposit:dep_1:credit_user", "type": "credit_user", "gateway": "pg", "resource_id": "dep_1",
       "payload": '{"amount_minor": 100}', "caused_by": "evt_1"}


def settings(url: str, **overrides: Any) -> Settings:
    return make_settings("127.0.0.1:9092", "postgresql://localhost/x", "ns", effects_url=url,
                         effects_secret=Secret(SECRET), **overrides)


@asynccontextmanager
async def merchant() -> AsyncIterator[tuple[str, list[str]]]:
    """A merchant whose /moved redirects to /elsewhere (which takes anything), whose /endless refuses
    with an answer that never ends; yields its URL and the paths that received a POST."""
    seen: list[str] = []
    closing = asyncio.Event()

    async def moved(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(status=307, headers={"Location": "/elsewhere"})

    async def elsewhere(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(status=204)

    async def endless(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        resp = web.StreamResponse(status=500)
        await resp.prepare(request)
        chunk = b"merchant says no " * 4096
        for _ in range(4096):  # 272 MiB if read to the end
            await resp.write(chunk)
        return resp

    async def silent(request: web.Request) -> web.Response:
        seen.append(request.path)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closing.wait(), 30)  # no answer before the merchant closes
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/moved", moved)
    app.router.add_post("/elsewhere", elsewhere)
    app.router.add_post("/endless", endless)
    app.router.add_post("/silent", silent)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        closing.set()
        await runner.cleanup()


async def post(url: str, config: Settings | None = None) -> str | None:
    worker = EffectsWorker(config or settings(url))
    worker.open_http()  # the client start() opens
    assert worker.http is not None
    try:
        return await worker._post(url, ROW)
    finally:
        await worker.http.close()


async def test_a_redirect_is_a_failed_attempt_with_its_reason_and_never_followed() -> None:
    async with merchant() as (url, seen):
        error = await post(f"{url}/moved")
    assert error == "HTTP 307: a redirect (to '/elsewhere'), not followed"  # the old client: None (delivered)
    assert seen == ["/moved"]  # the old client: ["/moved", "/elsewhere"], the signed body re-sent


async def test_a_refusing_answer_is_read_only_up_to_the_cap() -> None:
    async with merchant() as (url, seen):
        started = time.monotonic()
        error = await post(f"{url}/endless")
    assert error is not None and error.startswith("HTTP 500: merchant says no")
    assert len(error) <= len("HTTP 500: ") + ANSWER_BYTES
    assert time.monotonic() - started < 5 and seen == ["/endless"]


async def test_the_request_deadline_is_orderly_effects_timeout_s() -> None:
    """Read from the environment as the process reads it; the default the 10 s it always was."""
    assert EffectsWorker(settings("http://127.0.0.1:1/e")).settings.effects_timeout_s == 10.0
    async with merchant() as (url, seen):
        config = Settings.from_env({**settings(url).to_env(), "ORDERLY_EFFECTS_TIMEOUT_S": "0.3"})
        started = time.monotonic()
        error = await post(f"{url}/silent", config)
        took = time.monotonic() - started
    assert error is not None and error.startswith("TimeoutError") and seen == ["/silent"]
    assert 0.3 <= took < 3, took  # the fixed client: 10 s


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://merchant.example/effects", True), ("http://127.0.0.1:8080/effects", True),
    ("http://[::1]/effects", True), ("http://localhost/effects", True), ("http://127.8.9.10/e", True),
    ("http://merchant.example/effects", False), ("http://10.0.0.5/effects", False),
    ("ftp://merchant.example/effects", False), ("merchant.example/effects", False), ("https:///x", False)])
def test_the_url_is_https_unless_loopback_or_allowed(url: str, allowed: bool) -> None:
    if allowed:
        assert delivery_key(settings(url)) is not None
    else:
        with pytest.raises(SettingsError, match="ORDERLY_EFFECTS_URL"):
            delivery_key(settings(url))
    if url.startswith("http://"):  # the explicit setting allows any http host
        assert delivery_key(settings(url, effects_allow_http=True)) is not None


@pytest.mark.parametrize(("timeout_s", "lease_s", "refused"), [(10.0, 30.0, False), (29.9, 30.0, False),
                                                              (30.0, 30.0, True), (45.0, 30.0, True)])
def test_a_request_may_not_outlast_its_lease(timeout_s: float, lease_s: float, refused: bool) -> None:
    """A delivery still open when its lease ends would be claimed again and sent twice."""
    config = Settings.from_env({**settings("https://merchant.example/e").to_env(),
                                "ORDERLY_EFFECTS_TIMEOUT_S": str(timeout_s), "ORDERLY_EFFECTS_LEASE_S": str(lease_s)})
    if refused:
        with pytest.raises(SettingsError, match=r"TIMEOUT_S=\S+ is not shorter than ORDERLY_EFFECTS_LEASE"):
            delivery_key(config)
    else:
        assert delivery_key(config) is not None
