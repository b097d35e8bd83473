"""The admin API and the operator commands against the running pipeline (DESIGN.md §3.1, issue #18):
every /api route and the OpenAPI document refuse a request without the admin token (the document's
paths and the router's routes, so a new route cannot be forgotten), every answer the tests get is
checked against the document (tests/openapi_check.py), the webhook port serves no resource data, the
reads answer what a fixed scenario put there, every action works and is audited, the console's
session cookie and CSRF token hold, the commands print the same, and schemathesis finds no 5xx.

The scenario is built once per module and its overview read before any test runs, so no test
depends on another: each action test acts on a resource of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
import pytest
from openapi_spec_validator import validate

from app.admin import auth
from app.admin.app import create_app
from app.admin.context import ADMIN
from app.admin.openapi import document
from app.bootstrap import prepare
from app.settings import Settings
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.e2e.test_quarantine import append_raw
from tests.openapi_check import checked
from tests.pg_events import deposit
from tests.pipeline import Running, running_pipeline
from tests.support import admin_token, make_settings, read_topic, serve_in_thread
from topics.catalog import names

CARD = "pay_adm"
GAP_BASE = 3  # dep_a_ok has sequence 1, dep_a_dead 2; the gap deposit 3 and 6: the open gap is 4..5


def card_event(eid: str, kind: str, second: int, amount: int) -> bytes:
    return orjson.dumps({"id": eid, "type": f"payment.{kind}", "payment_ref": CARD, "sequence": None,
                         "occurred_at": f"2026-11-29T10:02:{15 + second:02d}.123Z", "amount_minor": amount,
                         "currency": "EUR"})


@dataclass
class Scenario:
    pipe: Running
    overview: dict[str, Any]  # /api/overview read right after the scenario, before any test acted
    dead_keys: list[str]  # dep_a_dead's two effects, refused to their last attempt


async def correlate(pipe: Running, dep: str) -> None:
    async with aiohttp.ClientSession(middlewares=(checked(pipe.ingest.url, "ingest"),)) as http, http.put(
            f"{pipe.ingest.url}/correlations/pg/deposits/{dep}",
            data=orjson.dumps({"merchant_reference": f"mr_{dep}", "our_order_id": f"o_{dep}",
                               "our_user_id": f"u_{dep}"}),
            headers={"Authorization": f"Bearer {pipe.settings.api_token.reveal()}"}) as resp:
        assert resp.status == 200, await resp.text()


async def decided(pipe: Running, resource: str, count: int) -> None:
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) >= $2 FROM webhook_events WHERE resource_id = $1",
                                             resource, count))


async def build(pipe: Running) -> Scenario:
    """A card payment parked by an over-refund, a settled deposit whose effects were delivered, one
    whose effects died, an open pg gap, a body the ingest quarantined and a record the worker did."""
    await pipe.post("card", card_event("evt_c1", "captured", 1, 8000), card_event("evt_r", "refunded", 2, 10000),
                    card_event("evt_a", "authorised", 0, 12000))
    for dep in ("dep_a_ok", "dep_a_dead", "dep_a_gap"):
        await correlate(pipe, dep)
        await decided(pipe, dep, 1)
    await pipe.post("pg", deposit("dep_a_ok", 3, "settled", sequence=1))
    # every effect so far delivered (dep_a_ok's two and the card payment's, which nothing else waits
    # for) before the merchant starts refusing
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 3 AND count(*) FILTER (WHERE delivered_at IS NULL) = 0 FROM effects"))
    pipe.pipeline.terminate("effects")
    pipe.pipeline.start("effects", ORDERLY_EFFECTS_MAX_ATTEMPTS="2")
    pipe.stub.behave(refuse_with=500)
    await pipe.post("pg", deposit("dep_a_dead", 3, "settled", sequence=2))
    dead = await pipe.wait_for(lambda c: c.fetch(
        "SELECT dedupe_key FROM effects WHERE resource_id = 'dep_a_dead' AND dead_at IS NOT NULL "
        "ORDER BY dedupe_key"))
    while len(dead) < 2:
        dead = await pipe.wait_for(lambda c: c.fetch(
            "SELECT dedupe_key FROM effects WHERE resource_id = 'dep_a_dead' AND dead_at IS NOT NULL "
            "ORDER BY dedupe_key"))
    pipe.pipeline.terminate("effects")
    pipe.pipeline.start("effects")
    pipe.stub.behave()
    await decided(pipe, "dep_a_dead", 2)
    await pipe.post("pg", deposit("dep_a_gap", 1, "pending", sequence=GAP_BASE))
    await decided(pipe, "dep_a_gap", 2)
    await pipe.post("pg", deposit("dep_a_gap", 4, "pending", sequence=GAP_BASE + 3))
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 1 FROM pg_sequence_gaps"))
    answer = (await pipe.post("pg", deposit("dep_a_qi", 4, "under_review", review="a string")))[0]
    assert answer["quarantined"] is True
    await append_raw(pipe, "dep_a_qc", b"\xff not a correlation", "poison-a", correlation=True)
    async def two_set_aside(c: Any) -> list[Any] | None:
        rows = await c.fetch("SELECT delivery_id, stage, resource_id FROM quarantine ORDER BY stage")
        return rows if len(rows) >= 2 else None
    assert [(r["stage"], r["resource_id"]) for r in await pipe.wait_for(two_set_aside)] \
        == [("ingest", "dep_a_qi"), ("worker", "dep_a_qc")]
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 3 FROM webhook_events WHERE resource_id = $1", CARD))
    # the worker's set-aside record in the timeline too: another consumer than the quarantine table's
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM webhook_events WHERE delivery_id = 'poison-a'"))
    # every effect settled (delivered or dead) before the counts are read: how soon the restarted
    # effects worker delivers dep_a_gap's two status updates is not what the overview is about
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 7 AND count(*) FILTER (WHERE delivered_at IS NULL AND dead_at IS NULL) = 0 "
        "FROM effects"))
    status, overview = await pipe.admin_get("/api/overview")
    assert status == 200
    return Scenario(pipe, overview, [r["dedupe_key"] for r in dead])


@pytest.fixture(scope="module")
def scenario(kafka: KafkaBroker, postgres: PostgresServer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"adm{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path_factory.mktemp("admin")) as pipe:
        yield asyncio.run(build(pipe))


def client(**options: Any) -> aiohttp.ClientSession:
    """A client whose every answer from an admin on this host is checked against the OpenAPI document
    (tests/openapi_check.py): an undocumented status, media type or field fails the test that asked."""
    return aiohttp.ClientSession(middlewares=(checked("http://127.0.0.1:"),), **options)


def bearer_of(settings: Settings) -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token(settings)}"}


def bearer(pipe: Running) -> dict[str, str]:
    return bearer_of(pipe.settings)


def concrete(path: str) -> str:
    return re.sub(r"\{gateway\}", "card", re.sub(r"\{[a-z_]+\}", "x", path))


async def test_every_api_route_refuses_a_request_without_the_token(scenario: Scenario) -> None:
    pipe = scenario.pipe
    async with client() as http:
        async with http.get(f"{pipe.admin}/openapi.json", headers=bearer(pipe)) as resp:
            assert resp.status == 200
            doc = await resp.json()
        operations = [(method.upper(), path) for path, item in doc["paths"].items() if path.startswith("/api/")
                      for method in item]
        # the router's own /api routes: one added without its OpenAPI entry fails here
        routed = {(r.method, r.resource.canonical) for r in create_app(pipe.settings).router.routes()
                  if r.resource is not None and r.resource.canonical.startswith("/api/") and r.method != "HEAD"}
        assert routed == {(m, re.sub(r"\{(\w+):[^}]*\}", r"{\1}", p)) for m, p in routed}  # canonical drops regexes
        assert routed == set(operations)
        assert len(operations) >= 12
        wrong = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {admin_token(pipe.settings)}"},
                 # the correlation token is another secret
                 {"Authorization": f"Bearer {pipe.settings.api_token.reveal()}"},
                 {"Cookie": f"{auth.SESSION_COOKIE}=forged.session.cookie"}]
        app = create_app(pipe.settings)  # an admin of its own, whose wrong-token throttle this test resets
        with serve_in_thread(app) as url:
            for method, path in [*operations, ("GET", "/openapi.json")]:  # the document is a viewer's too
                for headers in wrong:
                    app[ADMIN].throttle.failures.clear()  # 429 after ten is another test's subject
                    async with http.request(method, f"{url}{concrete(path)}", headers=headers) as resp:
                        assert resp.status == 401, (method, path, headers, resp.status)
                        assert resp.content_type == "application/problem+json"
                        assert {"type", "title", "status", "detail"} <= (await resp.json()).keys()
        # a page without a session goes to the login page, naming where it was going
        async with http.get(f"{pipe.admin}/resources/card/{CARD}", allow_redirects=False) as resp:
            assert resp.status == 303
            assert resp.headers["Location"] == f"/login?next={quote('/resources/card/' + CARD, safe='')}"
    audit = (await pipe.admin_get("/api/audit?limit=500"))[1]["items"]
    assert not [a for a in audit if a["action"] not in ("console.login", "break-glass")]  # nothing refused was done


async def test_the_openapi_document_is_valid_openapi_3_1_and_covers_the_ingest(scenario: Scenario) -> None:
    async with client() as http:
        async with http.get(f"{scenario.pipe.admin}/openapi.json", headers=bearer(scenario.pipe)) as resp:
            doc = await resp.json()
        async with http.get(f"{scenario.pipe.admin}/openapi.json", allow_redirects=False) as resp:
            assert resp.status == 401 and (await resp.json())["status"] == 401  # not a redirect to sign-in
    validate(doc)  # raises on an invalid OpenAPI 3.1 document
    assert doc["openapi"] == "3.1.0" and doc == orjson.loads(orjson.dumps(document()))
    ingest = {"/webhooks/{gateway}", "/correlations/pg/deposits/{deposit_id}", "/healthz", "/readyz"}
    assert ingest <= set(doc["paths"]) and "effect" in doc["webhooks"]


async def test_the_webhook_port_serves_no_resource_data_metrics_or_admin(scenario: Scenario) -> None:
    pipe = scenario.pipe
    async with aiohttp.ClientSession() as http:  # the webhook port's 404s: no documented operation's
        for path in (f"/resources/card/{CARD}", f"/api/resources/card/{CARD}", "/api/overview", "/api/quarantine",
                     "/openapi.json", "/", "/login", "/quarantine", "/effects", "/parked", "/metrics"):
            for headers in ({}, bearer(pipe)):
                async with http.get(f"{pipe.ingest.url}{path}", headers=headers) as resp:
                    body = await resp.text()
                    assert resp.status in (404, 405), (path, resp.status)
                    assert CARD not in body and "evt_c1" not in body
        async with http.get(pipe.ingest.metrics_url) as resp:  # its own port; counters by gateway and outcome only
            text = await resp.text()
            assert resp.status == 200 and "orderly_ingest_requests_total" in text
            assert CARD not in text and "dep_a_" not in text and "evt_" not in text


async def test_the_overview_counts_what_the_scenario_made(scenario: Scenario) -> None:
    o = scenario.overview
    # card: evt_c1 unparked, evt_r parked, evt_a applied; pg: 3 correlations + 4 deposit events applied
    # (dep_a_ok, dep_a_dead, dep_a_gap twice); the ingest's quarantined body has no decision, the
    # worker's set-aside correlation one
    assert o["deliveries"]["total"] == {"applied": 8, "unparked": 1, "parked": 1, "quarantined": 1}
    assert o["deliveries"]["last_hour"] == o["deliveries"]["total"]
    assert (o["parked"], o["open_gaps"], o["quarantined"], o["quarantined_total"]) == (1, 1, 2, 2)
    assert (o["effects_pending"], o["effects_dead"]) == (0, 2)
    # dep_a_ok's credit_user and release_goods, pay_adm's mark_order_paid, dep_a_gap's two status updates
    assert o["effects_delivered"] == 5
    assert isinstance(o["consumer_lag"], list)


async def test_a_resource_shows_its_state_timeline_and_effects(scenario: Scenario) -> None:
    pipe = scenario.pipe
    status, card = await pipe.resource("card", CARD)
    assert status == 200
    assert (card["state"]["kind"], card["state"]["state"], card["state"]["captured_minor"], card["parked"]) \
        == ("payment", "captured", 8000, 1)
    assert {d["event_id"]: d["outcome"] for d in card["timeline"]} == {"evt_c1": "unparked", "evt_r": "parked",
                                                                       "evt_a": "applied"}
    refund = next(d for d in card["timeline"] if d["event_id"] == "evt_r")
    assert "refund" in refund["why"] and refund["gateway_time"] == "2026-11-29T10:02:17.123Z"

    status, dep = await pipe.resource("pg", "dep_a_ok")
    assert status == 200 and dep["state"]["status"] == "settled"
    timeline = [(d["event_type"], d["outcome"], sorted((e["type"], e["status"]) for e in d["effects"]))
                for d in dep["timeline"]]
    assert timeline == [("correlation.registered", "applied", []),
                        ("deposit.settled", "applied", [("credit_user", "delivered"), ("release_goods", "delivered")])]
    assert dep["timeline"][1]["version"] == "3" and dep["timeline"][1]["sequence"] == "1"
    status, dead = await pipe.resource("pg", "dep_a_dead")
    assert {e["dedupe_key"]: e["status"] for e in dead["effects"]}.keys() == set(scenario.dead_keys)
    assert all(e["attempts"] >= 2 for e in dead["effects"])

    status, quarantined = await pipe.resource("pg", "dep_a_qi")  # only what the ingest set aside
    assert status == 200 and quarantined["state"] is None
    assert [(d["outcome"], "data.object.review" in d["why"]) for d in quarantined["timeline"]] \
        == [("quarantined", True)]
    assert (await pipe.resource("pg", "dep_never"))[0] == 404
    assert (await pipe.resource("nope", "dep_a_ok"))[0] == 404
    assert (await pipe.resource("pg", "x" * 300))[0] == 400


async def test_search_pages_newest_first_with_a_cursor(scenario: Scenario) -> None:
    pipe = scenario.pipe
    seen: list[tuple[str, str]] = []
    cursor = ""
    for _ in range(20):
        status, page = await pipe.admin_get(f"/api/resources?limit=2{'&cursor=' + quote(cursor) if cursor else ''}")
        assert status == 200 and len(page["items"]) <= 2
        seen += [(i["gateway"], i["resource_id"]) for i in page["items"]]
        if not page["next_cursor"]:
            break
        cursor = page["next_cursor"]
    assert sorted(seen) == sorted({("card", CARD), ("pg", "dep_a_ok"), ("pg", "dep_a_dead"), ("pg", "dep_a_gap"),
                                   ("pg", "dep_a_qc")} | set(seen))  # each once, whatever later tests added
    assert len(seen) == len(set(seen))
    times = [i["last_at"] for i in (await pipe.admin_get("/api/resources?limit=500"))[1]["items"]]
    assert times == sorted(times, reverse=True)
    status, found = await pipe.admin_get("/api/resources?gateway=card&status=parked")
    assert [(i["resource_id"], i["parked"]) for i in found["items"]] == [(CARD, 1)]
    status, found = await pipe.admin_get("/api/resources?q=evt_r")  # an exact gateway event id
    assert [i["resource_id"] for i in found["items"]] == [CARD]
    status, found = await pipe.admin_get("/api/resources?q=a_de")  # part of a resource id
    assert [i["resource_id"] for i in found["items"]] == ["dep_a_dead"]
    assert (await pipe.admin_get("/api/resources?q=%25"))[1]["items"] == []  # % is matched as itself
    for bad in ("cursor=not-a-cursor", "limit=0", "limit=501", "limit=abc", "gateway=nope"):
        status, body = await pipe.admin_get(f"/api/resources?{bad}")
        assert status == 400 and body["error"], bad


async def test_parked_and_gaps_say_since_when_and_why(scenario: Scenario) -> None:
    pipe = scenario.pipe
    parked = (await pipe.admin_get("/api/parked"))[1]["items"]
    assert [(p["gateway"], p["resource_id"], p["deliveries"], p["first_event_type"]) for p in parked] \
        == [("card", CARD, 1, "payment.refunded")]
    assert parked[0]["parked_since"] and "refund" in parked[0]["why"]
    gaps = (await pipe.admin_get("/api/gaps"))[1]["items"]
    assert [(g["start_seq"], g["end_seq"], g["missing"]) for g in gaps] == [(GAP_BASE + 1, GAP_BASE + 2, 2)]
    assert gaps[0]["age_s"] >= 0 and gaps[0]["backfill"].startswith("waiting")


async def test_quarantine_lists_shows_and_redrives_with_an_audit_row(scenario: Scenario) -> None:
    pipe = scenario.pipe
    items = (await pipe.admin_get("/api/quarantine"))[1]["items"]
    by_resource = {i["resource_id"]: i for i in items}
    assert {r: i["stage"] for r, i in by_resource.items()} == {"dep_a_qi": "ingest", "dep_a_qc": "worker"}
    assert [i["resource_id"] for i in (await pipe.admin_get("/api/quarantine?stage=worker"))[1]["items"]] \
        == ["dep_a_qc"]
    status, one = await pipe.admin_get("/api/quarantine/poison-a")
    assert status == 200 and one["stage"] == "worker" and "JSONDecodeError" in one["reason"]
    assert one["body_bytes"] == len(b"\xff not a correlation")
    assert (await pipe.admin_get("/api/quarantine/nope"))[0] == 404

    async with client(headers=bearer(pipe)) as http:
        ingest_id = by_resource["dep_a_qi"]["delivery_id"]
        async with http.post(f"{pipe.admin}/api/quarantine/{quote(ingest_id, safe='')}/redrive") as resp:
            assert resp.status == 409 and "still refused" in (await resp.json())["error"]
        async with http.post(f"{pipe.admin}/api/quarantine/poison-a/redrive") as resp:
            assert resp.status == 200, await resp.text()
            assert "poison-a~r1" in (await resp.json())["result"]
    # appended again and decided: set aside once more (nothing was fixed), in its timeline
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT outcome = 'quarantined' FROM webhook_events WHERE delivery_id = 'poison-a~r1'"))
    assert (await pipe.admin_get("/api/quarantine/poison-a"))[1]["redrives"] == 1
    rows = (await pipe.admin_get("/api/audit?limit=500"))[1]["items"]
    audit = [(a["action"], a["target"], a["result"].split(":")[0]) for a in rows if a["action"] == "quarantine.redrive"]
    appended = f"appended to {names(pipe.settings.namespace).raw} as delivery poison-a~r1"
    assert ("quarantine.redrive", "poison-a", appended) in audit
    assert ("quarantine.redrive", ingest_id, "refused") in audit
    assert all(a["actor"].startswith("break-glass@") for a in rows if a["action"] == "quarantine.redrive")
    assert ("quarantine.view", "poison-a", "shown") in [(a["action"], a["target"], a["result"]) for a in rows]


async def test_a_dead_effect_retried_through_the_api_is_delivered_once(scenario: Scenario) -> None:
    pipe, key = scenario.pipe, scenario.dead_keys[0]
    assert key in {e["dedupe_key"] for e in (await pipe.admin_get("/api/effects?state=dead"))[1]["items"]}
    before = pipe.stub.deliveries[key]
    async with client(headers=bearer(pipe)) as http:
        async with http.post(f"{pipe.admin}/api/effects/{quote(key, safe='')}/retry") as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["result"].startswith("pending again after 2 attempt")
        await pipe.wait_for(lambda c: c.fetchval("SELECT delivered_at IS NOT NULL FROM effects WHERE dedupe_key = $1",
                                                 key))
        assert (before, pipe.stub.deliveries[key]) == (0, 1)
        async with http.post(f"{pipe.admin}/api/effects/{quote(key, safe='')}/retry") as resp:
            assert resp.status == 409 and "already delivered" in (await resp.json())["error"]
        async with http.post(f"{pipe.admin}/api/effects/no-such-effect/retry") as resp:
            assert resp.status == 404
    assert key in {e["dedupe_key"] for e in (await pipe.admin_get("/api/effects?state=delivered"))[1]["items"]}
    assert (await pipe.admin_get("/api/effects?state=gone"))[0] == 400


async def test_fetch_now_asks_the_fetcher_and_refuses_what_no_gateway_api_serves(scenario: Scenario) -> None:
    pipe = scenario.pipe
    async with client(headers=bearer(pipe)) as http:
        # this pipeline's fetcher has no gateway API: the request would never be read, so none is made
        async with http.post(f"{pipe.admin}/api/resources/card/{CARD}/fetch") as resp:
            assert resp.status == 409 and "ORDERLY_CARD_API_URL is not set" in (await resp.json())["error"]
        async with http.post(f"{pipe.admin}/api/resources/pg/dep_a_gap/fetch") as resp:
            assert resp.status == 409 and "ORDERLY_PG_API_URL is not set" in (await resp.json())["error"]
        async with http.post(f"{pipe.admin}/api/resources/paymos/inv_1/fetch") as resp:
            assert resp.status == 422
        async with http.post(f"{pipe.admin}/api/resources/nope/x/fetch") as resp:
            assert resp.status == 404
        async with http.post(f"{pipe.admin}/api/resources/card/{'x' * 300}/fetch") as resp:
            assert resp.status == 400
    assert await read_topic(pipe.settings.kafka_bootstrap, names(pipe.settings.namespace).fetch) == []
    # an admin configured with the card API (as a fetcher that serves the requests would be)
    with serve_in_thread(create_app(pipe.settings.with_overrides(api_urls={"card": "http://127.0.0.1:9"}))) as url:
        async with client(headers=bearer(pipe)) as http, \
                http.post(f"{url}/api/resources/card/{CARD}/fetch") as resp:
            assert resp.status == 200, await resp.text()
    requests = [(r.key, orjson.loads(r.value)) for r in await read_topic(pipe.settings.kafka_bootstrap,
                                                                         names(pipe.settings.namespace).fetch)]
    assert (f"card:{CARD}".encode(), {"gateway": "card", "kind": "payment", "payment_ref": CARD}) in requests


async def test_the_console_session_cookie_and_csrf_token(scenario: Scenario) -> None:
    pipe = scenario.pipe
    jar = aiohttp.CookieJar(unsafe=True)
    async with client(cookie_jar=jar) as http:
        async with http.post(f"{pipe.admin}/login", data={"token": "wrong", "next": "/"},
                             allow_redirects=False) as resp:
            assert resp.status == 401 and auth.SESSION_COOKIE not in resp.cookies
        signing_in = {"token": admin_token(pipe.settings), "next": "//evil.example/"}
        async with http.post(f"{pipe.admin}/login", data=signing_in, allow_redirects=False) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/"  # no open redirect
            cookie = resp.cookies[auth.SESSION_COOKIE]
            assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
        async with http.get(f"{pipe.admin}/api/overview") as resp:
            assert resp.status == 200  # the session works for the API too
        async with http.get(f"{pipe.admin}/effects?state=dead") as resp:
            page = await resp.text()
            assert resp.status == 200 and scenario.dead_keys[1] in page
            assert resp.headers["Content-Security-Policy"].startswith("default-src 'none'")
            token = re.search(r'name="csrf" value="([^"]+)"', page)
            assert token is not None
        target = f"{pipe.admin}/effects/no-such-effect/retry"
        for form in ({}, {"csrf": "forged"}, {"csrf": "another-sessions-token-" + "x" * 20}):
            async with http.post(target, data=form, allow_redirects=False) as resp:
                assert resp.status == 403, form
        async with http.post(target, data={"csrf": token.group(1), "next": "/effects"}, allow_redirects=False) as resp:
            assert resp.status == 303 and "refused=" in resp.headers["Location"]  # past CSRF: unknown key
        async with http.post(f"{pipe.admin}/logout", data={"csrf": token.group(1)}, allow_redirects=False) as resp:
            assert resp.status == 303
        async with http.get(f"{pipe.admin}/api/overview") as resp:
            assert resp.status == 401
    # signed out means ended: a copy of the cookie, replayed, is refused too
    async with client() as http:
        for path in ("/api/overview", "/audit"):
            async with http.get(f"{pipe.admin}{path}", allow_redirects=False,
                                headers={"Cookie": f"{auth.SESSION_COOKIE}={cookie.value}"}) as resp:
                assert resp.status in (401, 303), (path, resp.status)
    audit = (await pipe.admin_get("/api/audit?limit=500"))[1]["items"]
    logins = [a["result"] for a in audit if a["action"] == "console.login"]
    assert "signed in with the break-glass token" in logins and "refused: wrong token" in logins
    assert "signed out" in [a["result"] for a in audit if a["action"] == "console.logout"]
    refused = [a for a in audit if a["action"] == "effects.retry" and a["target"] == "no-such-effect"]
    assert refused and all(a["actor"].startswith("break-glass@") for a in refused)


def orderly(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True,
                          timeout=90, check=False)


def test_operator_commands_print_the_same_and_find_a_running_dev_stack(scenario: Scenario, tmp_path: Path) -> None:
    pipe = scenario.pipe
    # no Kafka or PostgreSQL in the environment: the commands read a running `orderly dev`'s stack.json
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORDERLY_")}
    env["ORDERLY_DATA_DIR"] = str(tmp_path)
    (tmp_path / "stack.json").write_text(json.dumps({
        "namespace": pipe.settings.namespace, "kafka_bootstrap": pipe.settings.kafka_bootstrap,
        "postgres_dsn": pipe.settings.postgres_dsn.reveal()}))

    shown = orderly(env, "inspect", "card", CARD)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"payment\.refunded\s+parked\b", shown.stdout), shown.stdout
    assert re.search(r"payment\.authorised\s+applied\s+mark_order_paid\(delivered\)", shown.stdout), shown.stdout
    assert "state: captured" in shown.stdout and "parked=1" in shown.stdout
    assert orderly(env, "inspect", "card", "pay_never").returncode == 1

    parked = orderly(env, "parked")
    assert parked.returncode == 0 and re.search(rf"card:{CARD}\s+1\b", parked.stdout), parked
    gaps = orderly(env, "gaps")
    assert gaps.returncode == 0 and re.search(rf"^{GAP_BASE + 1}-{GAP_BASE + 2}\s+2\s", gaps.stdout, re.MULTILINE), gaps
    listed = orderly(env, "quarantine", "list")
    assert listed.returncode == 0 and "poison-a" in listed.stdout, listed
    dead = orderly(env, "effects", "list", "--state", "dead")
    key = scenario.dead_keys[1]
    assert dead.returncode == 0 and key in dead.stdout, dead
    retried = orderly(env, "effects", "retry", key)
    assert retried.returncode == 0 and "pending again" in retried.stdout, retried
    asyncio.run(pipe.wait_for(lambda c: c.fetchval(
        "SELECT delivered_at IS NOT NULL FROM effects WHERE dedupe_key = $1", key)))
    assert pipe.stub.deliveries[key] == 1
    again = orderly(env, "effects", "retry", key)
    assert again.returncode == 1 and "already delivered" in again.stderr
    audit = asyncio.run(pipe.admin_get("/api/audit?action=effects.retry"))[1]["items"]
    assert any(a["action"] == "effects.retry" and a["target"] == key and a["actor"].startswith("cli:") for a in audit)

    # nothing to find: a clear configuration error, not a traceback
    (tmp_path / "stack.json").unlink()
    lost = orderly(env, "parked")
    assert lost.returncode == 2 and "no running `orderly dev` was found" in lost.stderr
    assert "Traceback" not in lost.stderr


def test_every_command_has_help_and_the_program_a_version() -> None:
    env = dict(os.environ)
    top = orderly(env, "--help")
    commands = re.findall(r"^    (\w+)\s{2,}\S", top.stdout, re.MULTILINE)
    assert {"dev", "demo", "admin", "inspect", "parked", "gaps", "quarantine", "effects", "replay"} <= set(commands)
    for command in commands:
        helped = orderly(env, command, "--help")
        description = helped.stdout.split("\n\n")[1] if "\n\n" in helped.stdout else ""
        assert helped.returncode == 0 and len(description.strip()) > 20, (command, helped.stdout)
    version = orderly(env, "--version")
    assert version.returncode == 0 and re.fullmatch(r"orderly \d+\.\d+\.\d+\S*\n", version.stdout), version.stdout


@pytest.mark.timeout(120)  # about 3x its duration (13.5 s and the module's 16 s set-up, measured alone)
def test_schemathesis_finds_no_server_error_in_the_admin_api(scenario: Scenario, tmp_path: Path) -> None:
    pipe = scenario.pipe
    report = tmp_path / "report"
    run = subprocess.run(
        [str(Path(sys.executable).parent / "schemathesis"), "run", f"{pipe.admin}/openapi.json",
         "--include-path-regex", "^/api/",
         # every answer it provokes is also one the document describes (its schema, its media type)
         "--checks", "not_a_server_error,response_schema_conformance,content_type_conformance",
         "--header", f"Authorization: Bearer {admin_token(pipe.settings)}", "--max-examples", "40",
         "--phases", "examples,coverage,fuzzing", "--seed", "18", "--workers", "1", "--request-timeout", "20",
         "--report", "junit", "--report-dir", str(report), "--generation-database", "none", "--no-color"],
        capture_output=True, text=True, timeout=600, check=False, env={**os.environ, "NO_COLOR": "1"}, cwd=tmp_path)
    print(run.stdout[-4000:])
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    cases = re.search(r"Test cases:\s*(\d+) generated", run.stdout)
    assert cases is not None and int(cases.group(1)) >= 200, run.stdout[-3000:]
    pipe.pipeline.assert_alive()


async def test_with_the_broker_lost_reads_go_on_and_actions_answer_503(
        postgres: PostgresServer, tmp_path: Path) -> None:
    """A broker of its own, stopped under a running admin that has appended before: an action gets
    503 with the reason within the append deadline (not a request that hangs until Kafka is back),
    its refusal is audited, and the reads still answer from PostgreSQL."""
    broker = KafkaBroker(tmp_path / "kafka")
    await asyncio.to_thread(broker.start)
    try:
        s = make_settings(broker.bootstrap, postgres.dsn, f"lost{uuid.uuid4().hex[:8]}", api_urls={"card": "http://127.0.0.1:9"})
        await prepare(s)
        with serve_in_thread(create_app(s)) as url:
            async with client(headers=bearer_of(s)) as http:
                async with http.post(f"{url}/api/resources/card/pay_lost/fetch") as resp:
                    assert resp.status == 200, await resp.text()
                await asyncio.to_thread(broker.stop)
                started = time.monotonic()
                async with http.post(f"{url}/api/resources/card/pay_lost/fetch",
                                     timeout=aiohttp.ClientTimeout(total=60)) as resp:
                    assert resp.status == 503 and "did not acknowledge" in (await resp.json())["error"]
                assert time.monotonic() - started < 30
                async with http.get(f"{url}/api/overview") as resp:
                    assert resp.status == 200
                async with http.get(f"{url}/api/audit") as resp:
                    results = [a["result"] for a in (await resp.json())["items"] if a["action"] == "resources.fetch"]
        assert results[0].startswith("refused: Kafka did not acknowledge") and results[1].endswith("requested")
    finally:
        await asyncio.to_thread(broker.stop)


HOSTILE_GETS = [
    "/api/resources?q=%00", "/api/resources?status=%00", "/api/quarantine?stage=%00", "/api/quarantine/%00",
    "/api/resources/pg/%00", "/api/resources?limit=%C2%B2", "/api/parked?limit=%C2%B2", "/api/effects?limit=%C2%B2",
    "/api/audit?limit=%C2%B2", "/api/quarantine?limit=%C2%B2", "/api/gaps?limit=%C2%B2",
    "/api/resources?q=" + "x" * 600, "/api/resources?cursor=" + "A" * 3000,
]


def cursor_of(*parts: str) -> str:
    import base64

    return base64.urlsafe_b64encode(orjson.dumps(list(parts))).decode().rstrip("=")


async def test_hostile_parameters_get_a_4xx_with_the_reason_never_a_5xx(scenario: Scenario) -> None:
    """What a hostile review found answered 500 (NUL that PostgreSQL's text refuses, Unicode digits
    as a limit, a cursor PostgreSQL's dates cannot hold) or dropped the connection (a control
    character in the login's next)."""
    pipe = scenario.pipe
    gets = [*HOSTILE_GETS, "/api/resources?cursor=" + cursor_of("0001-01-01T00:00:00+14:00", "card", "x"),
            "/api/resources?cursor=" + cursor_of("2026-01-01T00:00:00+00:00", "ca\x00rd", "x")]
    async with client(headers=bearer(pipe)) as http:
        for path in gets:
            async with http.get(f"{pipe.admin}{path}") as resp:
                assert resp.status == 400 and (await resp.json())["error"], (path, resp.status)
        for path in ("/api/effects/%00/retry", "/api/quarantine/%00/redrive"):
            async with http.post(f"{pipe.admin}{path}") as resp:
                assert resp.status == 400, (path, resp.status)
        async with http.post(f"{pipe.admin}/logout", allow_redirects=False) as resp:  # a bearer has no session
            assert resp.status == 303
    jar = aiohttp.CookieJar(unsafe=True)
    async with client(cookie_jar=jar) as http:
        for target in ("/\t/evil.example", "/\n/x", "/%0a", "https:evil.example", "/\x7f/x", "/ok\x00"):
            async with http.post(f"{pipe.admin}/login", data={"token": admin_token(pipe.settings), "next": target},
                                 allow_redirects=False) as resp:
                assert resp.status == 303 and resp.headers["Location"] in ("/", "/%0a"), (target, resp.headers)
        for path in ("/resources?q=%00", "/resources/pg/%00", "/quarantine/%00", "/quarantine?stage=%00"):
            async with http.get(f"{pipe.admin}{path}") as resp:
                assert resp.status == 400, (path, resp.status)
        # a message in a link is shown only with the admin's own MAC: no spoofed alerts
        async with http.get(f"{pipe.admin}/parked?refused=Session+key+rotated%3A+paste+your+token+at+evil") as resp:
            assert resp.status == 200 and "Session key rotated" not in await resp.text()
    pipe.pipeline.assert_alive()


async def test_a_form_body_that_never_arrives_gets_408(scenario: Scenario) -> None:
    host, port = scenario.pipe.admin.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                     b"Content-Length: 100\r\n\r\ntoken=")
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 30)
        assert status.startswith(b"HTTP/1.1 408"), status
    finally:
        writer.close()


async def test_wrong_bearer_tokens_are_throttled_per_address(scenario: Scenario) -> None:
    pipe = scenario.pipe
    with serve_in_thread(create_app(pipe.settings)) as url:  # a throttle of its own: the others' is untouched
        async with client() as http:
            answers = []
            for _ in range(11):
                async with http.get(f"{url}/api/overview", headers={"Authorization": "Bearer guess"}) as resp:
                    answers.append(resp.status)
            assert answers == [401] * 10 + [429]
            async with http.get(f"{url}/api/overview", headers=bearer(pipe)) as resp:
                assert resp.status == 200  # a right token is never refused by the throttle (issue #45)


async def test_ids_with_braces_are_reachable_and_redrives_at_once_get_distinct_ids(scenario: Scenario) -> None:
    pipe = scenario.pipe
    ref = "pay_{brace}/1"
    body = orjson.dumps({"id": "evt_brace", "type": "payment.authorised", "payment_ref": ref, "sequence": None,
                         "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": 100, "currency": "EUR"})
    await pipe.post("card", body)
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 1 FROM webhook_events WHERE resource_id = $1", ref))
    status, found = await pipe.resource("card", ref)
    assert status == 200 and found["state"]["authorised_minor"] == 100

    await append_raw(pipe, "dep_a_many", b"\xff not a correlation either", "poison-many", correlation=True)
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 1 FROM quarantine WHERE delivery_id = 'poison-many'"))
    async with client(headers=bearer(pipe)) as http:
        async def redrive() -> str:
            async with http.post(f"{pipe.admin}/api/quarantine/poison-many/redrive") as resp:
                assert resp.status == 200, await resp.text()
                return str((await resp.json())["result"]).rsplit(" ", 1)[1]
        ids = await asyncio.gather(redrive(), redrive(), redrive())
    assert sorted(ids) == ["poison-many~r1", "poison-many~r2", "poison-many~r3"]
    assert (await pipe.admin_get("/api/quarantine/poison-many"))[1]["redrives"] == 3


async def test_the_admin_starts_and_serves_postgresql_while_kafka_is_away(scenario: Scenario, tmp_path: Path) -> None:
    pipe = scenario.pipe
    from app.stack.process import spare_port

    port = spare_port()
    env = {**os.environ, **pipe.settings.with_overrides(kafka_bootstrap=f"127.0.0.1:{spare_port()}",
                                                         admin_port=port).to_env()}
    log = (tmp_path / "admin.log").open("wb")
    proc = await asyncio.to_thread(subprocess.Popen, [sys.executable, "-m", "app.cli", "admin"], env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        async with client(headers=bearer(pipe)) as http:
            while True:
                assert proc.poll() is None, (tmp_path / "admin.log").read_text()[-3000:]
                try:
                    async with http.get(f"http://127.0.0.1:{port}/api/overview") as resp:
                        overview = await resp.json()
                        break
                except aiohttp.ClientConnectionError:
                    assert time.monotonic() < deadline, (tmp_path / "admin.log").read_text()[-3000:]
                    await asyncio.sleep(0.2)
            assert overview["parked"] == scenario.overview["parked"]
            async with http.post(f"http://127.0.0.1:{port}/api/quarantine/poison-a/redrive") as resp:
                assert resp.status == 503 and "nothing was done" in (await resp.json())["error"]
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
