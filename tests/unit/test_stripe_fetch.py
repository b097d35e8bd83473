"""The stripe fetch (docs/gateways/stripe.md, "Fetch"): the two requests the fetcher builds from the
registry's Fetch (with the API key as a bearer token), the pair of answers as one synced record,
unusable answers set aside with a reason naming the field and nothing appended, never a raise; and
the simulator's Stripe API that answers them."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core import stripe as core
from app.core.model import Delivery
from app.fetcher import Fetcher
from app.gateways import registry
from app.gateways import stripe as adapter
from app.setting_kinds import Secret
from app.settings import TABLE
from app.simulator import api, lifecycles, plugins, stripe_api
from app.simulator.stripe import lifecycle
from tests.support import make_settings, serve_in_thread

PI = "pi_unit_fetch"


def intent(pi: str = PI, status: str = "succeeded", charge: Any = None) -> dict[str, Any]:
    return {"id": pi, "object": "payment_intent", "status": status, "amount": 2000, "amount_received": 2000,
            "currency": "eur", "latest_charge": charge}


def charge(refunded: int = 500) -> dict[str, Any]:
    return {"id": "ch_1", "object": "charge", "status": "succeeded", "amount": 2000, "amount_captured": 2000,
            "amount_refunded": refunded, "captured": True, "payment_intent": PI, "currency": "eur"}


def refunds(*items: dict[str, Any], has_more: bool = False) -> dict[str, Any]:
    return {"object": "list", "data": list(items), "has_more": has_more, "url": "/v1/refunds"}


REFUND = {"id": "re_1", "object": "refund", "status": "succeeded", "amount": 500, "charge": "ch_1",
          "payment_intent": PI, "currency": "eur"}


def test_stripes_registry_line_declares_the_two_requests_and_the_settings() -> None:
    fetch = registry.GATEWAYS["stripe"].fetch
    assert fetch is not None and fetch.synced is adapter.synced and fetch.parked is core.FETCH_WANTED
    assert (fetch.resource, fetch.also, fetch.kind, fetch.id_field) == (
        "/v1/payment_intents/{id}?expand[]=latest_charge", "/v1/refunds?payment_intent={id}&limit=100",
        "payment_intent", "payment_intent")
    rows = {row.env: row for row in TABLE}
    assert not rows["ORDERLY_STRIPE_API_URL"].is_secret and rows["ORDERLY_STRIPE_API_KEY"].is_secret
    assert "ORDERLY_CARD_API_KEY" not in rows  # only a gateway whose API takes a key has the setting


def test_the_paths_quote_the_id() -> None:
    assert adapter.fetch_paths("pi_a/b&c") == ("/v1/payment_intents/pi_a%2Fb%26c?expand[]=latest_charge",
                                               "/v1/refunds?payment_intent=pi_a%2Fb%26c&limit=100")


def test_the_pair_of_answers_is_one_synced_record_the_reducer_takes_as_the_base() -> None:
    record = adapter.synced(PI, (intent(charge=charge()), refunds(REFUND)), 1_796_000_500_999)
    w = adapter.read(record, True)
    assert isinstance(w, adapter.Webhook) and isinstance(w.event, adapter.Synced)
    assert w.event.created == 1_796_000_500  # the fetch's second
    _, decisions = core.apply_event(None, w, Delivery("f1", "stripe", f"stripe:{PI}", 0, 0, "fetch"))
    row = decisions[0].row
    assert decisions[0].outcome == "synced" and row is not None
    assert (row["status"], row["amount_received_minor"], row["amount_refunded_minor"]) == ("succeeded", 2000, 500)
    # not expanded (a string): no charge, the refunds alone tell what is refunded
    plain = orjson.loads(adapter.synced(PI, (intent(charge="ch_1"), refunds(REFUND)), 0))
    assert plain["data"]["charge"] is None and len(plain["data"]["refunds"]) == 1


@pytest.mark.parametrize(("answers", "reason"), [
    ("not a pair", "answer: expected the PaymentIntent and its refunds"),
    ((intent(), refunds(), refunds()), "answer: expected the PaymentIntent and its refunds"),
    ((intent(pi="pi_other"), refunds()), "answer.id: asked for 'pi_unit_fetch', got 'pi_other'"),
    (([], refunds()), "answer: the PaymentIntent is not a JSON object"),
    ((intent(), {"data": []}), "answer: the refunds are not a list object"),
    ((intent(), refunds(has_more=True)), "answer.has_more: more than 100 refunds"),
    (({**intent(), "status": 7}, refunds()), "answer"),  # a wrong type: the schema names the field
    ((intent(charge={"id": "ch_1", "object": "charge", "amount": -1}), refunds()), "answer"),
    (({**intent(), "object": "charge"}, refunds()), "answer.object: expected 'payment_intent'"),
])
def test_an_unusable_answer_is_refused_with_a_reason(answers: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("(", r"\(")):
        adapter.synced(PI, answers, 0)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.tuples(JSON, JSON) | JSON, st.sampled_from(["id", "object", "status", "amount", "latest_charge"]), JSON)
def test_any_answer_is_a_record_or_a_value_error_never_another_raise(answers: object, field: str,
                                                                      value: object) -> None:
    cases = [answers, (dict(intent(charge=charge()), **{field: value}), refunds(REFUND))]
    for case in cases:
        try:
            adapter.read(adapter.synced(PI, case, 0), True)
        except ValueError:
            pass


# --- the fetcher's requests --------------------------------------------------------------------

class Appended:
    """The fetcher's producer: what it appends."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes, Any]] = []

    async def send_and_wait(self, topic: str, key: bytes, value: bytes, headers: Any) -> None:
        self.records.append((topic, key, value, headers))


@contextmanager
def stripe_answering(answer: Callable[[web.Request], Awaitable[web.Response]],
                     seen: list[tuple[str, str | None]]) -> Iterator[str]:
    @web.middleware
    async def record(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
        seen.append((request.path_qs, request.headers.get("Authorization")))
        return await handler(request)

    app = web.Application(middlewares=[record])
    app.router.add_get("/v1/payment_intents/{id}", answer)
    app.router.add_get("/v1/refunds", answer)
    with serve_in_thread(app) as url:
        yield url


async def fetch_with(url: str, key: str | None) -> tuple[int, Fetcher, Appended]:
    s = make_settings("127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "unit", api_urls={"stripe": url},
                      api_keys={"stripe": Secret(key) if key else None})
    fetcher = Fetcher(s)
    appended = Appended()
    fetcher.producer = appended  # type: ignore[assignment]
    async with aiohttp.ClientSession() as fetcher.http:
        return await fetcher.sync_resource("stripe", PI), fetcher, appended


async def test_the_fetcher_asks_both_paths_with_the_key_and_appends_one_synced_record() -> None:
    seen: list[tuple[str, str | None]] = []

    async def answer(request: web.Request) -> web.Response:
        if request.path.startswith("/v1/payment_intents/"):
            expanded = request.query.getall("expand[]", []) == ["latest_charge"]
            return web.json_response(intent(charge=charge() if expanded else "ch_1"))
        assert request.query["payment_intent"] == PI
        return web.json_response(refunds(REFUND))

    with stripe_answering(answer, seen) as url:
        appended_count, fetcher, appended = await fetch_with(url, "sk_test_unit")
    assert appended_count == 1
    assert [path.replace("%5B%5D", "[]") for path, _ in seen] == [
        f"/v1/payment_intents/{PI}?expand[]=latest_charge", f"/v1/refunds?payment_intent={PI}&limit=100"]
    assert {auth for _, auth in seen} == {"Bearer sk_test_unit"}
    [(_, key, value, headers)] = appended.records
    assert key == f"stripe:{PI}".encode() and dict(headers)["source"] == b"fetch"
    body = orjson.loads(value)
    assert body["object"] == "orderly.synced" and body["data"]["charge"]["id"] == "ch_1"
    assert fetcher.metrics.fetches.labels("stripe", "synced")._value.get() == 1


async def test_without_a_key_no_authorization_is_sent() -> None:
    seen: list[tuple[str, str | None]] = []

    async def answer(request: web.Request) -> web.Response:
        return web.json_response(intent() if "payment_intents" in request.path else refunds())

    with stripe_answering(answer, seen) as url:
        appended_count, _, _ = await fetch_with(url, None)
    assert appended_count == 1 and [auth for _, auth in seen] == [None, None]


@pytest.mark.parametrize(("intent_answer", "refunds_answer", "status", "outcome"), [
    (intent(pi="pi_someone_else"), refunds(), 200, "unusable"),
    (intent(), {"object": "list", "data": "x"}, 200, "unusable"),
    (intent(), refunds(has_more=True), 200, "unusable"),
    ([1, 2], refunds(), 200, "unusable"),
    (intent(), refunds(), 404, "not_found"),
])
async def test_an_unusable_or_missing_answer_appends_nothing_and_is_counted(
        intent_answer: object, refunds_answer: object, status: int, outcome: str) -> None:
    seen: list[tuple[str, str | None]] = []

    async def answer(request: web.Request) -> web.Response:
        if "payment_intents" in request.path:
            return web.json_response(intent_answer)
        return web.json_response(refunds_answer, status=status)

    with stripe_answering(answer, seen) as url:
        appended_count, fetcher, appended = await fetch_with(url, None)
    assert appended_count == 0 and appended.records == []
    assert fetcher.metrics.fetches.labels("stripe", outcome)._value.get() == 1
    if outcome == "unusable":
        assert fetcher.metrics.set_aside.labels("fetcher", "stripe")._value.get() == 1


@pytest.mark.parametrize(("metadata", "reason"), [
    ({"k": "a\x00b"}, "data.object.metadata.k: a string holds a NUL character"),
    (orjson.loads(b'{"a":' * 40 + b"{}" + b"}" * 40), "JSON nests deeper than 32"),
])
async def test_an_answer_past_the_limits_is_set_aside_to_the_quarantine_once_per_answer(
        metadata: object, reason: str) -> None:
    """Past the limits every input keeps (DESIGN §2.4): to orderly.quarantine, stage fetcher, with the
    reason, never to orderly.raw (the worker would set aside a new copy at every fetch); the same answer
    again is the same quarantined record."""
    async def answer(request: web.Request) -> web.Response:
        if "payment_intents" in request.path:
            return web.json_response({**intent(), "metadata": metadata})
        return web.json_response(refunds())

    with stripe_answering(answer, []) as url:
        fetcher = Fetcher(make_settings("127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "unit",
                                        api_urls={"stripe": url}))
        appended = Appended()
        fetcher.producer = appended  # type: ignore[assignment]
        async with aiohttp.ClientSession() as fetcher.http:
            counts = [await fetcher.sync_resource("stripe", PI) for _ in range(2)]
    assert counts == [0, 0]
    assert {topic for topic, _, _, _ in appended.records} == {"unit.quarantine"}
    (_, first_id, body, headers), (_, second_id, _, _) = appended.records
    found = dict(headers)
    assert (found["stage"], found["topic"], found["gateway"], found["source"]) == (
        b"fetcher", b"unit.raw", b"stripe", b"fetch")
    assert reason in found["reason"].decode() and found["resource_key"] == f"stripe:{PI}".encode()
    assert first_id == second_id and first_id.startswith(b"fetch-")  # one quarantined record per answer
    assert orjson.loads(body)["object"] == "orderly.synced"
    assert fetcher.metrics.fetches.labels("stripe", "unusable")._value.get() == 2
    assert fetcher.metrics.set_aside.labels("fetcher", "stripe")._value.get() == 2


# --- the simulator's Stripe API --------------------------------------------------------------------

def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def simulated() -> tuple[lifecycles.Truth, str, list[tuple[dict[str, Any], dict[str, Any] | None, list[Any]]]]:
    rng = random.Random(7)
    life = next(life for n in range(50) if (life := lifecycle(rng, f"pi_api{n}")).truth.row["status"] == "succeeded"
                and life.answers[-1][2])
    truth = lifecycles.Truth()
    stripe_api.answers(truth)[life.resource] = life.answers
    return truth, life.resource, life.answers


def test_the_simulated_api_answers_stripes_shapes_from_the_truth() -> None:
    truth, pi, answers = simulated()
    app = api.build(truth, [])
    with serve_in_thread(app) as url:
        i_path, r_path = adapter.fetch_paths(pi)
        status, expanded = get(url + i_path)
        _, plain = get(f"{url}/v1/payment_intents/{pi}")
        _, listed = get(url + r_path)
        missing = get(f"{url}/v1/payment_intents/pi_nope")
    final_intent, final_charge, final_refunds = answers[-1]
    assert status == 200 and expanded == {**final_intent, "latest_charge": final_charge}
    assert plain["latest_charge"] == final_charge["id"] if final_charge else plain["latest_charge"] is None
    assert listed == {"object": "list", "data": final_refunds, "has_more": False, "url": "/v1/refunds"}
    assert missing[0] == 404 and missing[1]["error"]["code"] == "resource_missing"
    record = adapter.synced(pi, (expanded, listed), 1_796_999_000_000)
    w = adapter.read(record, True)
    assert isinstance(w, adapter.Webhook)
    _, decisions = core.apply_event(None, w, Delivery("f", "stripe", f"stripe:{pi}", 0, 0, "fetch"))
    row = decisions[0].row
    assert row is not None and (row["status"], row["amount_refunded_minor"]) == (
        final_intent["status"], sum(r["amount"] for r in final_refunds if r["status"] in ("pending", "succeeded")))


def test_the_stale_and_404_apis() -> None:
    truth, pi, answers = simulated()
    stale = api.build(truth, [], "stale")
    with serve_in_thread(stale) as url:
        status, body = get(f"{url}/v1/payment_intents/{pi}")
    assert status == 200 and body["status"] == answers[-2][0]["status"]
    assert {k: v for k, v in body.items() if k != "latest_charge"} == {
        k: v for k, v in answers[-2][0].items() if k != "latest_charge"}
    none = api.build(truth, [], "404")
    with serve_in_thread(none) as url:
        assert get(f"{url}/v1/payment_intents/{pi}")[0] == 404
        assert get(f"{url}/v1/refunds?payment_intent={pi}")[0] == 404
    assert none[api.SERVED].count("stripe GET /v1/payment_intents/{id}", 404) == 1


def test_the_simulators_lifecycles_fill_what_its_api_answers() -> None:
    truth = lifecycles.Truth()
    made = plugins.simulator_of("stripe").lifecycles
    assert made is not None
    emitted = made(random.Random(3), 4, truth)
    assert {e.resource for e in emitted} == set(stripe_api.answers(truth)) == {f"pi_sim{i}" for i in range(4)}
