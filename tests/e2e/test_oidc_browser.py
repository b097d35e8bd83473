"""Signing in to the console through Keycloak's own login page in a real browser (e2e; DESIGN.md §3.1).

Debian's headless Chromium, driven by Selenium as in tests/e2e/test_console_browser.py, opens the
console, follows "Sign in with your organisation's account" to Keycloak, types each test person's
name and password into Keycloak's form and comes back signed in: the header names the person and
their role, a viewer is refused a raw body (403) that an operator may open, the admin makes and
revokes a personal token on the Tokens page, and the admin's audit page lists all three by name.
Needs PostgreSQL and Keycloak (not Kafka). Screenshots go to test-artifacts/oidc/.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
from aiohttp import web
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.wait import WebDriverWait

from app.admin.app import create_app
from app.settings import Secret, Settings
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from tests.keycloak import CLIENT_ID, CLIENT_SECRET, PASSWORDS, ROLE_MAP, Keycloak
from tests.support import make_settings

pytestmark = pytest.mark.timeout(300)
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "oidc"


@contextmanager
def served_admin(settings: Settings, port: int) -> Iterator[None]:
    """The admin app on ``port`` from a thread with its own loop (the redirect URL names the port)."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(create_app(settings), access_log=None)
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(20), "admin did not start"
    try:
        yield
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(20)


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"  # Debian's: Selenium Manager is never asked (no internet)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1366,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: WebDriver) -> WebDriverWait[WebDriver]:
    return WebDriverWait(driver, 30, poll_frequency=0.2)


def sign_in_through_keycloak(driver: WebDriver, admin: str, user: str) -> None:
    # every cookie, Keycloak's (path /realms/…) too: else its single sign-on brings the last person back
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.get(f"{admin}/")
    wait(driver).until(lambda d: urlsplit(d.current_url).path == "/login")
    wait(driver).until(ec.element_to_be_clickable((By.ID, "sign-in-oidc"))).click()
    wait(driver).until(ec.visibility_of_element_located((By.ID, "username"))).send_keys(user)
    driver.find_element(By.ID, "password").send_keys(PASSWORDS[user])
    driver.save_screenshot(str(SHOTS / f"keycloak-{user}.png"))
    driver.find_element(By.ID, "kc-login").click()
    wait(driver).until(lambda d: d.current_url.startswith(admin) and urlsplit(d.current_url).path == "/")


async def test_each_person_signs_in_through_keycloaks_page_in_chromium(
        keycloak: Keycloak, postgres: PostgresServer, namespace: str, db: asyncpg.Connection,
        browser: WebDriver) -> None:
    port = spare_port()
    admin = f"http://127.0.0.1:{port}"
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace).with_overrides(
        admin_oidc_issuer=keycloak.issuer, admin_oidc_client_id=CLIENT_ID,
        admin_oidc_client_secret=Secret(CLIENT_SECRET), admin_oidc_redirect_url=f"{admin}/auth/callback",
        admin_role_map=ROLE_MAP, admin_token=None)
    with served_admin(settings, port):
        for user, role in (("vera", "viewer"), ("otto", "operator"), ("ada", "admin")):
            await asyncio.to_thread(sign_in_through_keycloak, browser, admin, user)
            assert browser.find_element(By.ID, "who").text == f"{user} · {role}"
            assert not browser.find_elements(By.ID, "break-glass")
            await asyncio.to_thread(browser.get, f"{admin}/quarantine/no-such-delivery")
            body = browser.find_element(By.TAG_NAME, "body").text
            if role == "viewer":
                assert "this needs operator" in body, body
            else:
                assert "no quarantined record" in body, body
            browser.save_screenshot(str(SHOTS / f"signed-in-{user}.png"))
        # ada, the admin signed in last, makes a personal token on the console's page and revokes it
        await asyncio.to_thread(browser.get, f"{admin}/tokens")
        browser.find_element(By.NAME, "name").send_keys("ci")
        browser.find_element(By.CSS_SELECTOR, "#new-token-form button").click()
        token = wait(browser).until(ec.visibility_of_element_located((By.ID, "token-value"))).text
        assert token.startswith("oat_")
        browser.save_screenshot(str(SHOTS / "token-made.png"))
        browser.find_element(By.CSS_SELECTOR, "#tokens form button").click()
        wait(browser).until(lambda d: "/tokens?done=" in d.current_url)  # back on the page, which says so
        assert "revoked" in browser.find_element(By.ID, "tokens").text
        assert token not in browser.page_source  # shown once
        await asyncio.to_thread(browser.get, f"{admin}/audit")
        page = browser.find_element(By.TAG_NAME, "body").text
        for user in ("vera", "otto", "ada"):
            assert f"{user}@127.0.0.1" in page, page[:3000]
        browser.save_screenshot(str(SHOTS / "audit.png"))
