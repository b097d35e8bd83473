"""The console in a real browser (e2e; DESIGN.md §3.1): Debian's headless Chromium driven by Selenium
against a running pipeline. One scenario is set up through the ingest and the log — a card payment
parked by an over-refund, a body of an unknown type set aside at the ingest, a correlation the worker
cannot read, two dead effects — and an operator signs in, reads the counts and the payment's
timeline (in arrival and in gateway order), retries a dead effect and redrives quarantined records,
all by what the pages show.

The tests run in file order on one pipeline and one browser: the later ones act on what the earlier
ones read. Every page visited is saved as a PNG under test-artifacts/console/.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.wait import WebDriverWait

from app.admin.auth import SESSION_COOKIE
from app.producer import KeyedProducer
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.e2e.test_card_pipeline import card_event
from tests.e2e.test_effects_delivery import restart_effects, settle_deposits
from tests.pipeline import Running, running_pipeline
from tests.support import admin_token, make_settings
from topics.catalog import names
from topics.records import correlation_headers

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-artifacts" / "console"
WAIT_S = 30.0

REF = "pay_8c21"  # captured 8000 of 12000, then a refund of 10000: parked until a second capture
UNKNOWN_TYPE = "payment.disputed"  # validly signed, a type the card adapter does not know: quarantined
POISON = "poison-c"  # a correlation that is not JSON, appended to the log as a bug could: the worker sets it aside
POISON_DEPOSIT = "dep_qc"
# What the scenario fixes, before any operator action:
# webhook_events: evt_c1 unparked (applied once the authorisation came), evt_r parked, evt_a applied,
# the poison correlation quarantined by the worker, the dead deposit's correlation and settlement
# applied. The unknown type never reaches the worker: it is only a quarantine row.
OUTCOMES = {"applied": 3, "unparked": 1, "parked": 1, "quarantined": 1, "synced": 0, "stale": 0, "duplicate": 0}
PARKED_RESOURCES = 1
QUARANTINED = 2  # the unknown type (ingest) and the poison correlation (worker)
CARD_EFFECTS = 1  # card:pay_8c21:mark_order_paid (the authorisation let the capture apply), delivered
DEAD_EFFECTS = 2  # the dead deposit's credit_user and release_goods, refused to their last attempt


@dataclass
class Scenario:
    pipe: Running
    dead_keys: list[str]


async def append_poison_correlation(pipe: Running) -> None:
    """A correlation record that is not JSON, straight into orderly.raw (the ingest would refuse it)."""
    producer = KeyedProducer(pipe.settings.kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(names(pipe.settings.namespace).raw, f"pg:{POISON_DEPOSIT}".encode(),
                                     b"\xff not a correlation",
                                     correlation_headers("pg", POISON, int(time.time() * 1000)))
    finally:
        await producer.stop()


async def set_up(pipe: Running) -> list[str]:
    """The scenario through the ingest and the log; the dead effects' dedupe keys."""
    await pipe.post("card", card_event(REF, "evt_c1", "captured", 1, 8000),
                    card_event(REF, "evt_r", "refunded", 2, 10000), card_event(REF, "evt_a", "authorised", 0, 12000))
    answer = (await pipe.post("card", card_event(REF, "evt_d", UNKNOWN_TYPE.split(".")[1], 4, 8000)))[0]
    assert answer.get("quarantined") is True, answer
    await append_poison_correlation(pipe)
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 3 AND count(*) FILTER (WHERE outcome = 'parked' AND event_id = 'evt_r') = 1 "
        "FROM webhook_events WHERE resource_id = $1", REF))
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = $1 FROM quarantine", QUARANTINED))
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = $1 FROM effects WHERE resource_id = $2 AND delivered_at IS NOT NULL", CARD_EFFECTS, REF))
    # every later effect is refused to its second and last attempt
    restart_effects(pipe, ORDERLY_EFFECTS_MAX_ATTEMPTS="2")
    pipe.stub.behave(refuse_with=500)
    keys = await settle_deposits(pipe, "dead", 1)
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = $2 FROM effects WHERE dedupe_key = ANY($1) AND dead_at IS NOT NULL", keys, len(keys)))
    assert len(keys) == DEAD_EFFECTS
    # the projector writes the timeline apart from the effects recorder: every decision is in it
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = $1 FROM webhook_events", sum(OUTCOMES.values())))
    return keys


@pytest.fixture(scope="module")
def scenario(kafka: KafkaBroker, postgres: PostgresServer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"ui{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path_factory.mktemp("console-browser")) as pipe:
        yield Scenario(pipe, asyncio.run(set_up(pipe)))


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"  # Debian's: Selenium Manager is never asked (no internet)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1366,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    driver.implicitly_wait(0)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


# --- what the page shows ---------------------------------------------------------------------

def wait(driver: WebDriver, timeout: float = WAIT_S) -> WebDriverWait[WebDriver]:
    return WebDriverWait(driver, timeout, poll_frequency=0.2)


def shown(driver: WebDriver, css: str) -> WebElement:
    element: WebElement = wait(driver).until(ec.visibility_of_element_located((By.CSS_SELECTOR, css)))
    return element


def text(driver: WebDriver, css: str) -> str:
    return shown(driver, css).text.strip()


def shot(driver: WebDriver, name: str) -> Path:
    path = SHOTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot {path}"
    return path


def open_page(driver: WebDriver, base: str, path: str, heading: str) -> None:
    driver.get(base + path)
    wait(driver).until(lambda d: d.find_element(By.TAG_NAME, "h1").text.strip().startswith(heading))


def path_of(driver: WebDriver) -> str:
    return urlsplit(driver.current_url).path


def row_with(driver: WebDriver, table: str, needle: str) -> WebElement:
    """The first row of ``table`` whose text has ``needle``."""
    rows = [r for r in driver.find_elements(By.CSS_SELECTOR, f"{table} tbody tr") if needle in r.text]
    assert rows, f"no row of {table} shows {needle!r}: {driver.find_element(By.CSS_SELECTOR, table).text}"
    return rows[0]


def refreshed_until(driver: WebDriver, check: Callable[[WebDriver], bool], timeout: float = WAIT_S) -> None:
    """Reload the page until ``check`` holds (what the pipeline does next shows on a reload)."""
    def reloaded(d: WebDriver) -> bool:
        d.refresh()
        return check(d)
    wait(driver, timeout).until(reloaded)


def timeline(driver: WebDriver) -> list[tuple[str, str, str]]:
    """(event type, event or delivery id, outcome) of each row of the resource page's #timeline."""
    rows = []
    for row in driver.find_elements(By.CSS_SELECTOR, "#timeline tbody tr"):
        event = row.find_element(By.CSS_SELECTOR, "td.event")
        ident = event.find_element(By.CLASS_NAME, "sub").text.strip()
        kind = event.text.strip().removesuffix(ident).strip()
        rows.append((kind, ident, row.find_element(By.CSS_SELECTOR, "td .badge").text.strip()))
    return rows


# The overview's script replaces the counts every few seconds: read them in one go, in the page.
READ_COUNTS = """
const tiles = [...document.querySelectorAll('#counts .n')].map(n => [n.id, n.textContent.trim()]);
const outcomes = [...document.querySelectorAll('#outcomes td[data-outcome]')]
  .map(c => ['outcome-' + c.dataset.outcome, c.textContent.trim()]);
return Object.fromEntries([...tiles, ...outcomes]);"""


def counts(driver: WebDriver) -> dict[str, str]:
    """The overview's tiles (``n-parked``, …) and total deliveries by outcome (``outcome-applied``, …)."""
    found: dict[str, str] = driver.execute_script(READ_COUNTS)
    return found


def no_horizontal_overflow(driver: WebDriver) -> None:
    scroll, client = driver.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert scroll <= client, f"{driver.current_url}: {scroll} px wide in a {client} px window"


def sign_in(driver: WebDriver, token: str) -> None:
    shown(driver, "#token").send_keys(token)
    driver.find_element(By.ID, "sign-in").click()


# --- the steps --------------------------------------------------------------------------------

def test_pages_ask_for_a_session_and_the_wrong_token_is_refused(scenario: Scenario, browser: WebDriver) -> None:
    pipe = scenario.pipe
    browser.delete_all_cookies()
    browser.get(pipe.admin + "/")
    wait(browser).until(lambda d: path_of(d) == "/login")
    assert text(browser, "h1") == "Sign in"
    shot(browser, "01-login")

    sign_in(browser, "not-the-admin-token")
    assert text(browser, ".flash.bad") == "wrong token"
    assert path_of(browser) == "/login" and not browser.get_cookies()
    shot(browser, "02-login-wrong-token")

    sign_in(browser, admin_token(pipe.settings))
    wait(browser).until(lambda d: path_of(d) == "/")
    assert text(browser, "h1") == "Overview"
    assert [(c["name"], c["httpOnly"], c["sameSite"]) for c in browser.get_cookies()] == [
        (SESSION_COOKIE, True, "Strict")]


def test_the_overview_shows_the_scenarios_counts(scenario: Scenario, browser: WebDriver) -> None:
    open_page(browser, scenario.pipe.admin, "/", "Overview")
    assert counts(browser) == {
        "n-parked": str(PARKED_RESOURCES), "n-gaps": "0", "n-quarantined": str(QUARANTINED), "n-pending": "0",
        "n-dead": str(DEAD_EFFECTS), "n-delivered": str(CARD_EFFECTS),
        **{f"outcome-{name}": str(n) for name, n in OUTCOMES.items()}}
    assert "bad" in (shown(browser, "#n-dead").find_element(By.XPATH, "..").get_attribute("class") or "")
    no_horizontal_overflow(browser)
    shot(browser, "03-overview")


def test_the_parked_payment_is_found_and_its_timeline_read(scenario: Scenario, browser: WebDriver) -> None:
    open_page(browser, scenario.pipe.admin, "/", "Overview")
    search = shown(browser, "header .search input[name=q]")
    search.send_keys(REF, Keys.ENTER)
    wait(browser).until(lambda d: path_of(d) == "/resources")
    shown(browser, "main table")
    shot(browser, "04-search")
    link = browser.find_element(By.LINK_TEXT, f"card:{REF}")
    assert "parked 1" in row_with(browser, "main", f"card:{REF}").text
    link.click()

    wait(browser).until(lambda d: path_of(d) == f"/resources/card/{REF}")
    assert text(browser, "h1") == f"card {REF}"
    assert text(browser, "#status") == "captured"
    assert text(browser, "#parked-count") == "1 parked"
    rows = timeline(browser)
    assert rows[:3] == [("payment.captured", "evt_c1", "unparked"), ("payment.refunded", "evt_r", "parked"),
                        ("payment.authorised", "evt_a", "applied")]
    # the unknown type has no decision, only its quarantine row: no event type, its delivery id, why
    assert len(rows) == 4 and (rows[3][0], rows[3][2]) == ("", "quarantined"), rows
    cells = browser.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")
    assert "row-parked" in (cells[1].get_attribute("class") or "")
    assert "a refund above what is captured" in cells[1].find_element(By.CSS_SELECTOR, "td.why").text
    assert f"unknown event type '{UNKNOWN_TYPE}'" in cells[3].find_element(By.CSS_SELECTOR, "td.why").text
    no_horizontal_overflow(browser)
    shot(browser, "05-resource-parked")


def test_the_timeline_sorts_by_gateway_order_and_marks_the_late_delivery(scenario: Scenario,
                                                                         browser: WebDriver) -> None:
    """Arrival order is the default; the gateway order tab lists the authorisation first, as the
    card gateway's occurred_at has it; either way the authorisation is marked late, and the amounts
    show with their currency and the times with their zone."""
    open_page(browser, scenario.pipe.admin, f"/resources/card/{REF}", "card")
    assert text(browser, "#order a.on") == "arrival order"
    assert [ident for _, ident, _ in timeline(browser)][:3] == ["evt_c1", "evt_r", "evt_a"]
    rows = browser.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")
    assert [r.find_element(By.CSS_SELECTOR, "td.gw").text for r in rows] == ["2", "3", "1 late", ""]
    assert ["row-late" in (r.get_attribute("class") or "") for r in rows] == [False, False, True, False]
    assert text(browser, "#late-count").startswith("1 delivery(s) arrived after one the gateway placed later")
    assert [r.find_element(By.CSS_SELECTOR, "td.amount").text for r in rows[:3]] == [
        "80.00 EUR", "100.00 EUR", "120.00 EUR"]
    received = [r.find_elements(By.CSS_SELECTOR, "td.t")[0].text for r in rows]
    assert all(len(t) == 20 and t.endswith("Z") and t[10] == "T" for t in received), received
    amounts = {r.find_element(By.TAG_NAME, "th").get_attribute("textContent"): r.find_element(By.TAG_NAME, "td").text
               for r in browser.find_elements(By.CSS_SELECTOR, "#amounts tr")}  # th is shown upper case
    assert (amounts["authorised_minor"], amounts["captured_minor"]) == ("120.00 EUR", "80.00 EUR")
    assert '"captured_minor": 8000' in text(browser, "pre.json")  # the raw integer stays in the JSON
    no_horizontal_overflow(browser)
    shot(browser, "05a-timeline-arrival-order")

    browser.find_element(By.LINK_TEXT, "gateway order").click()
    wait(browser).until(lambda d: urlsplit(d.current_url).query == "order=gateway")
    assert text(browser, "#order a.on") == "gateway order"
    assert [(ident, outcome) for _, ident, outcome in timeline(browser)][:3] == [
        ("evt_a", "applied"), ("evt_c1", "unparked"), ("evt_r", "parked")]
    rows = browser.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")
    assert [r.find_element(By.CSS_SELECTOR, "td.arrival").text for r in rows] == ["3", "1", "2", "4"]
    assert [r.find_element(By.CSS_SELECTOR, "td.gw").text for r in rows] == ["1 late", "2", "3", ""]
    no_horizontal_overflow(browser)
    shot(browser, "05b-timeline-gateway-order")

    browser.find_element(By.LINK_TEXT, "arrival order").click()
    wait(browser).until(lambda d: urlsplit(d.current_url).query == "")
    assert [ident for _, ident, _ in timeline(browser)][:3] == ["evt_c1", "evt_r", "evt_a"]


def test_a_dead_effect_is_retried_and_delivered_once(scenario: Scenario, browser: WebDriver) -> None:
    pipe = scenario.pipe
    key, other = scenario.dead_keys  # credit_user, release_goods
    open_page(browser, pipe.admin, "/effects?state=dead", "Effects")
    assert text(browser, ".tabs a.on") == f"dead ({DEAD_EFFECTS})"
    row = row_with(browser, "#effects", key)
    assert (row.find_element(By.CSS_SELECTOR, ".badge").text, row.find_element(By.CSS_SELECTOR, "td.why").text) \
        == ("dead", "HTTP 500")
    no_horizontal_overflow(browser)
    shot(browser, "06-effects-dead")

    pipe.stub.behave()  # the merchant answers again
    row.find_element(By.TAG_NAME, "button").click()
    assert text(browser, ".flash.ok") == f"effects.retry {key}: pending again after 2 attempt(s)"
    shot(browser, "07-effects-retried")
    wait(browser, 60).until(lambda _: pipe.stub.deliveries[key] >= 1)
    asyncio.run(pipe.wait_for(lambda c: c.fetchval(
        "SELECT delivered_at IS NOT NULL FROM effects WHERE dedupe_key = $1", key)))
    assert (pipe.stub.deliveries[key], pipe.stub.deliveries[other], pipe.stub.requests[other]) == (1, 0, 2)

    open_page(browser, pipe.admin, "/effects?state=delivered", "Effects")
    row = row_with(browser, "#effects", key)
    assert row.find_element(By.CSS_SELECTOR, ".badge").text == "delivered"
    assert row.find_elements(By.TAG_NAME, "td")[3].text == "3"  # two refused, the retried one delivered
    assert text(browser, ".tabs").split() == [
        "dead", f"({DEAD_EFFECTS - 1})", "pending", "(0)", "delivered", f"({CARD_EFFECTS + 1})"]
    assert not row.find_elements(By.TAG_NAME, "button")
    shot(browser, "08-effects-delivered")


def test_quarantined_records_are_redriven_or_refused(scenario: Scenario, browser: WebDriver) -> None:
    pipe = scenario.pipe
    open_page(browser, pipe.admin, "/quarantine", "Quarantine")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#quarantine tbody tr")) == QUARANTINED
    poison = row_with(browser, "#quarantine", POISON)
    assert poison.find_elements(By.TAG_NAME, "td")[1].text == "worker"
    assert "JSONDecodeError" in poison.find_element(By.CSS_SELECTOR, "td.why").text
    shot(browser, "09-quarantine")

    # a correlation record is appended again whatever it holds: the worker decides it once more
    poison.find_element(By.TAG_NAME, "button").click()
    flash = text(browser, ".flash.ok")
    assert flash.startswith(f"quarantine.redrive {POISON}: appended to ") and flash.endswith(
        f" as delivery {POISON}~r1"), flash
    refreshed_until(browser, lambda d: any(
        r.find_elements(By.TAG_NAME, "td")[3].text == f"{POISON}~r1"
        for r in d.find_elements(By.CSS_SELECTOR, "#quarantine tbody tr")))
    redriven = [r for r in browser.find_elements(By.CSS_SELECTOR, "#quarantine tbody tr")
                if r.find_elements(By.TAG_NAME, "td")[3].text == POISON]
    assert len(redriven) == 1
    assert redriven[0].find_elements(By.TAG_NAME, "td")[5].text.startswith("1\N{MULTIPLICATION SIGN}, ")
    shot(browser, "10-quarantine-redriven")

    open_page(browser, pipe.admin, f"/resources/pg/{POISON_DEPOSIT}", "pg")
    assert [(ident, outcome) for _, ident, outcome in timeline(browser)] == [
        (POISON, "quarantined"), (f"{POISON}~r1", "quarantined")]
    shot(browser, "11-resource-redriven")

    # a webhook body its adapter still refuses is not appended again: the page says why
    open_page(browser, pipe.admin, "/quarantine", "Quarantine")
    unknown = row_with(browser, "#quarantine", f"card:{REF}")
    delivery_id = unknown.find_elements(By.TAG_NAME, "td")[3].text
    unknown.find_element(By.TAG_NAME, "button").click()
    assert text(browser, ".flash.bad") == (f"{delivery_id}: still refused by the card adapter: "
                                           f"type: unknown event type '{UNKNOWN_TYPE}'")
    assert row_with(browser, "#quarantine", f"card:{REF}").find_elements(By.TAG_NAME, "td")[5].text == ""
    shot(browser, "12-quarantine-refused")

    # the redriven original no longer counts as quarantined; its new delivery, set aside again, does
    open_page(browser, pipe.admin, "/", "Overview")
    refreshed_until(browser, lambda d: counts(d)["outcome-quarantined"] == str(OUTCOMES["quarantined"] + 1))
    assert counts(browser)["n-quarantined"] == str(QUARANTINED)


def test_the_state_shows_timestamps_as_text(scenario: Scenario, browser: WebDriver) -> None:
    open_page(browser, scenario.pipe.admin, "/resources/pg/dep_dead0", "pg")
    state = text(browser, "pre.json")
    assert '"credited_user_at": "20' in state and "datetime.datetime(" not in state, state


def test_no_page_is_wider_than_a_laptop_window(scenario: Scenario, browser: WebDriver) -> None:
    pages = [("/", "Overview", "overview"), (f"/resources/card/{REF}", "card", "resource"),
             ("/resources/pg/dep_dead0", "pg", "resource-pg"),
             ("/resources", "Resources", "resources"), ("/parked", "Parked", "parked"), ("/gaps", "Open pg", "gaps"),
             ("/quarantine", "Quarantine", "quarantine"), ("/effects?state=delivered", "Effects", "effects"),
             ("/audit", "Audit", "audit")]
    for path, heading, name in pages:
        open_page(browser, scenario.pipe.admin, path, heading)
        no_horizontal_overflow(browser)
        shot(browser, f"13-width-{name}")


def test_the_dead_effects_left_are_counted_then_retried_by_filter(scenario: Scenario, browser: WebDriver) -> None:
    """The effects page's bulk form: "Count" is a dry run, then every dead pg effect created in the
    last hour is retried in one click, with one audit row (the earlier test retried one of two)."""
    pipe = scenario.pipe
    _, other = scenario.dead_keys
    open_page(browser, pipe.admin, "/effects?state=dead", "Effects")
    shown(browser, "details.bulk summary").click()
    form = shown(browser, "#bulk-retry")
    for option in form.find_elements(By.CSS_SELECTOR, "select[name=gateway] option"):
        if option.text == "pg":
            option.click()
    form.find_element(By.NAME, "since").send_keys("1h")
    shot(browser, "14-effects-bulk-form")
    form.find_element(By.CSS_SELECTOR, "button[value=true]").click()
    wait(browser).until(ec.staleness_of(form))  # the answer's page, not the form's (its flash is stale)
    counted = text(browser, ".flash.ok")
    assert counted.startswith("effects.retry.bulk state=dead gateway=pg since=20"), counted
    assert counted.endswith(": dry run: 1 match, a call would act on 1"), counted
    assert pipe.stub.requests[other] == 2  # counted, not sent

    shown(browser, "details.bulk summary").click()
    form = shown(browser, "#bulk-retry")
    form.find_element(By.NAME, "since").send_keys("1h")
    form.find_element(By.CSS_SELECTOR, "button[value=false]").click()
    wait(browser).until(ec.staleness_of(form))
    assert text(browser, ".flash.ok").endswith(": 1 of 1 matched back to pending"), text(browser, ".flash.ok")
    shot(browser, "15-effects-bulk-retried")
    wait(browser, 60).until(lambda _: pipe.stub.deliveries[other] >= 1)
    assert pipe.stub.deliveries[other] == 1
    open_page(browser, pipe.admin, "/audit", "Audit")
    assert len([r for r in browser.find_elements(By.CSS_SELECTOR, "main tbody tr")
                if "effects.retry.bulk" in r.text]) == 1  # the count wrote none, the retry one
