"""The stripe fetch speaks Stripe's real API: its two requests (app/gateways/stripe.py fetch_paths, and
the fetcher's own, built from the registry's Fetch with the API key as a bearer token)
against `stripe-mock` v0.203.0 — Stripe's own mock, driven by its OpenAPI document, which refuses a
parameter or path the API does not have — and the answers, as Stripe shapes them, become a synced
record the reducer takes as the PaymentIntent's base. The mock is built from the Go module proxy
into a cache on first use (Go is on every machine of this project: docs/gateways/stripe.md)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from app.core import stripe as core
from app.core.model import Delivery
from app.fetcher import Fetcher
from app.gateways import stripe as adapter
from app.setting_kinds import Secret
from tests.support import make_settings

VERSION = "v0.203.0"
TOOLS = Path.home() / ".cache" / "orderly-tools" / f"stripe-mock-{VERSION}"
KEY = "sk_test_orderly"


def built() -> Path:
    binary = TOOLS / "stripe-mock"
    if not binary.exists():
        env = {**os.environ, "GOBIN": str(TOOLS), "GOPATH": str(TOOLS / "gopath"), "GOFLAGS": "-modcacherw"}
        subprocess.run(["go", "install", f"github.com/stripe/stripe-mock@{VERSION}"], env=env, check=True,
                       timeout=600)
    return binary


@pytest.fixture(scope="module")
def mock() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([str(built()), "-http-addr", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "stripe-mock did not start"
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def get(url: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_fetch_requests_are_stripes_and_the_answers_become_the_base(mock: str) -> None:
    pi = "pi_orderly_fetch1"
    intent_path, refunds_path = adapter.fetch_paths(pi)
    status, intent = get(mock + intent_path)
    assert status == 200 and intent["id"] == pi and intent["object"] == "payment_intent"
    assert isinstance(intent["latest_charge"], dict) and intent["latest_charge"]["object"] == "charge"  # expanded
    status, refunds = get(mock + refunds_path)
    assert status == 200 and refunds["object"] == "list"
    record = adapter.synced_from(intent, refunds, 1_796_000_500)
    w = adapter.read(record, True)
    assert isinstance(w, adapter.Webhook) and isinstance(w.event, adapter.Synced)
    assert w.event.data.charge is not None and w.event.data.charge.id == intent["latest_charge"]["id"]
    assert [r.object for r in w.event.data.refunds] == ["refund"] * len(refunds["data"])
    _, decisions = core.apply_event(None, w, Delivery("f1", "stripe", f"stripe:{pi}", 0, 0, "fetch"))
    assert [d.outcome for d in decisions] == ["synced"]
    row = decisions[0].row
    assert row is not None
    assert (row["status"], row["amount_minor"], row["currency"]) == (intent["status"], intent["amount"],
                                                                     intent["currency"])
    again = adapter.synced_from(intent, refunds, 1_796_000_900)
    assert adapter.read(again, True) != w and orjson_id(again) == orjson_id(record)  # unchanged: a duplicate


def orjson_id(record: bytes) -> str:
    value = json.loads(record)["id"]
    assert isinstance(value, str)
    return value


def test_the_mock_refuses_what_stripes_api_does_not_have(mock: str) -> None:
    # a PaymentIntent has no charges list since 2022-11-15; an unknown parameter is refused too
    assert get(mock + "/v1/payment_intents/pi_x/charges")[0] == 404
    status, answer = get(mock + "/v1/refunds?payment_intent_id=pi_x")
    assert status == 400 and "additional properties are not allowed" in answer["error"]["message"]


class Appended:
    """The fetcher's producer: what it appends."""

    def __init__(self) -> None:
        self.values: list[bytes] = []

    async def send_and_wait(self, topic: str, key: bytes, value: bytes, headers: Any) -> None:
        self.values.append(value)


async def fetched_by_the_fetcher(mock: str, key: str | None) -> tuple[int, list[bytes], Fetcher]:
    settings = make_settings("127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "mock", api_urls={"stripe": mock},
                             api_keys={"stripe": Secret(key) if key else None})
    fetcher = Fetcher(settings)
    appended = Appended()
    fetcher.producer = appended  # type: ignore[assignment]
    async with aiohttp.ClientSession() as fetcher.http:
        return await fetcher.sync_resource("stripe", "pi_orderly_fetch2"), appended.values, fetcher


async def test_the_fetchers_own_requests_with_the_key_are_accepted_and_become_a_synced_record(mock: str) -> None:
    # the URLs the fetcher builds from the registry's Fetch (aiohttp's encoding of expand[] included)
    # and the key sent as a bearer token: stripe-mock refuses a request without one
    count, values, _ = await fetched_by_the_fetcher(mock, KEY)
    assert count == 1
    body = json.loads(values[0])
    assert body["object"] == "orderly.synced" and body["data"]["object"]["id"] == "pi_orderly_fetch2"
    assert body["data"]["charge"]["object"] == "charge"  # expanded
    count, values, fetcher = await fetched_by_the_fetcher(mock, None)
    assert (count, values) == (0, []) and fetcher.metrics.fetches.labels("stripe", "error")._value.get() >= 1
