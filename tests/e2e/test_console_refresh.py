"""The console's refresh script (app/admin/static/console.js) in a real browser: a part marked
data-refresh is refreshed from its URL, and never asked for again while an answer is still being
computed (an overview over a large history taking longer than the interval must not pile up
requests on the admin's pool). Debian's headless Chromium, as in test_console_browser.py."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.support import serve_in_thread

pytestmark = pytest.mark.timeout(120)
SCRIPT = Path(__file__).resolve().parents[2] / "app" / "admin" / "static" / "console.js"
ANSWER_S = 0.6  # each answer takes this long
EVERY_S = 0.2  # the part's data-every


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"  # Debian's: Selenium Manager is never asked (no internet)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_a_slow_part_is_asked_for_again_only_an_interval_after_its_last_answer(browser: WebDriver) -> None:
    spans: list[list[float]] = []  # [asked at, answered at] of each request

    async def page(_: web.Request) -> web.Response:
        return web.Response(content_type="text/html", text=(
            f'<html><body><div id="part" data-refresh="/part" data-every="{EVERY_S}">first</div>'
            '<script src="/console.js"></script></body></html>'))

    async def script(_: web.Request) -> web.FileResponse:
        return web.FileResponse(SCRIPT)

    async def part(_: web.Request) -> web.Response:
        span = [time.monotonic(), 0.0]
        spans.append(span)
        await asyncio.sleep(ANSWER_S)
        span[1] = time.monotonic()
        return web.Response(content_type="text/html", text=f"answer {len(spans)}")

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/part", part)
    app.router.add_get("/console.js", script)
    with serve_in_thread(app) as url:
        browser.get(url)
        deadline = time.monotonic() + 30
        while len(spans) < 4:
            assert time.monotonic() < deadline, spans
            time.sleep(0.05)
        assert browser.find_element(By.ID, "part").text.startswith("answer ")
    # asked every 0.2 s against answers of 0.6 s: timed from the last start (or queued by the browser
    # behind the one in flight), the next request would start at once, or while one is computed
    for before, after in itertools.pairwise(spans[:4]):
        assert before[1] > 0 and after[0] - before[1] >= EVERY_S / 2, spans  # answered, then asked again
