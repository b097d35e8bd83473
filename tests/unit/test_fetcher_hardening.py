"""The fetcher against a hostile or broken gateway API (issue #45's review): no redirect followed,
answers size-capped and decoded without recursion, http only to loopback unless allowed."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web

from app.fetcher import MAX_ANSWER_BYTES, Fetcher, check_api_urls
from app.setting_kinds import SettingsError
from app.settings import Settings
from tests.support import make_settings, serve_in_thread

asked: list[str] = []


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    async def answer(request: web.Request) -> web.StreamResponse:
        ref = request.match_info["ref"]
        asked.append(ref)
        if ref == "moved":
            raise web.HTTPTemporaryRedirect("/payments/elsewhere")
        if ref == "huge":
            return web.Response(body=b'{"pad": "' + b"x" * MAX_ANSWER_BYTES + b'"}', content_type="application/json")
        if ref == "deep":
            return web.Response(body=b"[" * 100_000 + b"]" * 100_000, content_type="application/json")
        return web.json_response({"payment_ref": ref, "state": "captured", "authorised_minor": 1,
                                  "captured_minor": 1, "refunded_minor": 0, "currency": "EUR"})

    app = web.Application()
    app.router.add_get("/payments/{ref}", answer)
    with serve_in_thread(app) as url:
        yield url


def settings_for(url: str, **overrides: object) -> Settings:
    return make_settings("127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "unit", api_urls={"card": url}, **overrides)


async def fetch(api: str, ref: str) -> tuple[object, float]:
    fetcher = Fetcher(settings_for(api))
    async with aiohttp.ClientSession() as fetcher.http:
        got = await fetcher.fetch_resource("card", f"{api}/payments/{ref}", ref, attempts=1)
    return got, fetcher.metrics.fetches.labels("card", "error")._value.get()


async def test_a_redirect_is_a_failed_fetch_never_followed(api: str) -> None:
    asked.clear()
    assert await fetch(api, "moved") == (None, 1.0)
    assert asked == ["moved"]  # the key would have gone to /payments/elsewhere


async def test_an_answer_over_the_cap_or_nested_past_the_limit_is_an_error_not_a_crash(api: str) -> None:
    assert await fetch(api, "huge") == (None, 1.0)
    assert await fetch(api, "deep") == (None, 1.0)  # the json module raised RecursionError here
    got, errors = await fetch(api, "pay_ok")
    assert errors == 0 and isinstance(got, dict) and got["state"] == "captured"


@pytest.mark.parametrize(("url", "allowed", "refused"), [
    ("https://api.gateway.example", False, False),
    ("http://127.0.0.1:9000", False, False),
    ("http://[::1]:9000", False, False),
    ("http://localhost:9000", False, False),
    ("http://api.gateway.example", False, True),
    ("http://api.gateway.example", True, False),
    ("ftp://api.gateway.example", True, True),
])
def test_a_gateway_api_is_asked_over_https_or_loopback(url: str, allowed: bool, refused: bool) -> None:
    settings = settings_for(url, fetch_allow_http=allowed)
    if refused:
        with pytest.raises(SettingsError, match="ORDERLY_CARD_API_URL"):
            check_api_urls(settings)
    else:
        check_api_urls(settings)
