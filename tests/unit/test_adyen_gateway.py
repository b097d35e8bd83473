"""The adyen adapter checked against Adyen's own code and documents: its signatures against the
official `Adyen` package's HMAC validator in both directions (with key rotation), Adyen's published
example notifications (its Webhooks OpenAPI document) parsed and routed, and the ingest's
multi-record append (docs/gateways/adyen.md)."""

from __future__ import annotations

import base64
import copy
import json
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from Adyen.util import generate_notification_sig, is_valid_hmac_notification

from app.core.dispatch import Incoming, plan_batch
from app.gateways import adyen, registry
from app.gateways.base import SignatureError
from app.ingest.answers import Unavailable
from app.ingest.app import validate_secrets
from app.ingest.receiver import Receiver
from app.logs import SampledLog
from app.metrics import IngestMetrics
from app.settings import dev_settings
from topics.catalog import TopicNames, names
from topics.records import CHECKED, raw_headers

KEY = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"  # Adyen's published test key
OLD_KEY = "74F490DD33F7327BAECC88B2947C011FC02D014A473AAA33A8EC93E4DC069174"
EXAMPLES = json.loads((Path(__file__).parent / "data" / "adyen_openapi_examples.json").read_text())["examples"]


def documented_item() -> dict[str, Any]:
    """The item of Adyen's HMAC documentation and of the library's own test (signature below)."""
    return {"pspReference": "7914073381342284", "merchantReference": "TestPayment-1407325143704",
            "merchantAccountCode": "TestMerchant", "amount": {"currency": "EUR", "value": 1130},
            "eventCode": "AUTHORISATION", "success": "true", "eventDate": "2019-05-06T17:15:34.121+02:00",
            "operations": ["CANCEL", "CAPTURE", "REFUND"], "paymentMethod": "visa"}


def sdk_signed(item: dict[str, Any], key: str) -> dict[str, Any]:
    signed = copy.deepcopy(item)
    signature = generate_notification_sig(item, key).decode()
    signed["additionalData"] = {**(item.get("additionalData") or {}), "hmacSignature": signature}
    return signed


def body_of(*items: dict[str, Any]) -> bytes:
    return orjson.dumps({"live": "false", "notificationItems": [{"NotificationRequestItem": i} for i in items]})


def test_the_documented_signature_is_orderlys() -> None:
    assert adyen.sign_item(documented_item(), KEY) == "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0="


def test_what_orderly_signs_the_sdk_accepts() -> None:
    items = [documented_item(), {**documented_item(), "eventCode": "CAPTURE", "pspReference": "CAP0000000000001",
                                 "originalReference": "7914073381342284", "merchantReference": "a:b\\c/d"}]
    body = orjson.loads(adyen.sign_body(items, KEY))
    for wrapper in body["notificationItems"]:
        assert is_valid_hmac_notification(wrapper["NotificationRequestItem"], KEY)
        assert not is_valid_hmac_notification(wrapper["NotificationRequestItem"], OLD_KEY)


def test_what_the_sdk_signs_orderly_accepts_with_rotation() -> None:
    new = sdk_signed(documented_item(), KEY)
    old = sdk_signed({**documented_item(), "pspReference": "8814073381342284"}, OLD_KEY)
    adyen.verify(body_of(new, old), {}, (KEY, OLD_KEY), 0)  # a key change under way: either key
    with pytest.raises(SignatureError, match=r"notificationItems\[1\]"):
        adyen.verify(body_of(new, old), {}, (KEY,), 0)  # one item no key signs: the whole request


def test_a_signed_field_changed_is_refused_and_event_date_is_not_signed() -> None:
    item = sdk_signed(documented_item(), KEY)
    for field, value in (("merchantReference", "other"), ("success", "false"), ("eventCode", "CAPTURE")):
        with pytest.raises(SignatureError):
            adyen.verify(body_of({**item, field: value}), {}, (KEY,), 0)
    with pytest.raises(SignatureError):
        adyen.verify(body_of({**item, "amount": {"currency": "EUR", "value": 1131}}), {}, (KEY,), 0)
    adyen.verify(body_of({**item, "eventDate": "2020-01-01T00:00:00+00:00"}), {}, (KEY,), 0)  # as Adyen signs


@pytest.mark.parametrize("body", [b"not json", b"{}", b'{"notificationItems": []}',
                                  body_of(documented_item()), b'{"notificationItems": [{"x": 1}]}'])
def test_a_body_without_a_verifiable_item_is_refused(body: bytes) -> None:
    with pytest.raises(SignatureError):
        adyen.verify(body, {}, (KEY,), 0)


def test_basic_auth_is_compared_whole() -> None:
    good = {"Authorization": "Basic " + base64.b64encode(b"adyen:s3cret").decode()}
    adyen.check_basic_auth(good, "adyen:s3cret")
    for headers in ({}, {"Authorization": "Basic " + base64.b64encode(b"adyen:s3cre").decode()}):
        with pytest.raises(SignatureError):
            adyen.check_basic_auth(headers, "adyen:s3cret")


@pytest.mark.parametrize("code", sorted(EXAMPLES))
def test_adyens_published_examples_parse_and_route(code: str) -> None:
    """Signed again with the SDK (the examples' signatures are elided), verified, split, routed."""
    item = EXAMPLES[code]["notificationItems"][0]["NotificationRequestItem"]
    raw = body_of(sdk_signed(item, KEY))
    adyen.verify(raw, {}, (KEY,), 0)
    [(record, route)] = adyen.split(raw)
    assert orjson.loads(record) == orjson.loads(body_of(sdk_signed(item, KEY)))["notificationItems"][0][
        "NotificationRequestItem"]
    if code not in adyen.EVENT_CODES:
        assert route.quarantine_code == "unknown_type" and "eventCode" in (route.quarantine_reason or "")
        return
    amount = item["amount"]
    assert route.event_id == f"{item['pspReference']}:{code}:{item['success']}:{amount['value']}:{amount['currency']}"
    if code in ("CHARGEBACK_REVERSED", "SECOND_CHARGEBACK"):  # published without originalReference
        assert "originalReference" not in item and route.resource_key is None
        where = "notificationItems[0].NotificationRequestItem.originalReference"
        assert route.quarantine_reason == f"{where}: required for {code}"
        return
    assert route.resource_key == {"AUTHORISATION": "adyen:QFQTPCQ8HXSKGK82"}.get(code, "adyen:9913140798220028")
    assert isinstance(adyen.read(record, True), adyen.Notification)


def test_each_item_is_stored_as_the_exact_bytes_it_had_in_the_body() -> None:
    raw = adyen.sign_body([documented_item(), {**documented_item(), "pspReference": "X2"}], KEY)
    parts = adyen.split(raw)
    assert [p[1].resource_key for p in parts] == ["adyen:7914073381342284", "adyen:X2"]
    assert all(record in raw for record, _ in parts)
    signed = orjson.loads(parts[0][0])
    assert is_valid_hmac_notification(signed, KEY)  # the stored record can be checked again at replay


def test_a_bad_item_among_good_ones_is_quarantined_alone_naming_the_field() -> None:
    bad = {**documented_item(), "pspReference": "X3", "amount": {"currency": "EUR", "value": -5}}
    parts = adyen.split(adyen.sign_body([documented_item(), bad], KEY))
    assert parts[0][1].resource_key == "adyen:7914073381342284"
    assert parts[1][1].resource_key is None
    assert (parts[1][1].quarantine_reason or "").startswith("notificationItems[1].NotificationRequestItem.amount.value")
    assert parts[1][1].resource_hint == "adyen:X3"


# --- the ingest's multi-record append -----------------------------------------------------------

class Appender:
    def __init__(self, fail_on: int | None = None) -> None:
        self.records: list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]] = []
        self.fail_on = fail_on

    async def append(self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        if self.fail_on is not None and len(self.records) == self.fail_on:
            self.fail_on = None
            raise Unavailable("kafka append failed: KafkaTimeoutError")
        self.records.append((topic, key, value, headers))


def receiver(appender: Appender, basic: str | None = None) -> tuple[Receiver, TopicNames]:
    env = {"ORDERLY_SECRET_ADYEN": f"{KEY},{OLD_KEY}"}
    if basic is not None:
        env["ORDERLY_ADYEN_BASIC_AUTH"] = basic
    topics = names("t")
    return Receiver(dev_settings(env), IngestMetrics(), appender,  # type: ignore[arg-type]
                    SampledLog(logging.getLogger("test")), topics), topics


async def test_every_item_is_appended_under_its_own_key_before_accepted() -> None:
    appender = Appender()
    r, topics = receiver(appender)
    items = [documented_item(), {**documented_item(), "eventCode": "CAPTURE", "pspReference": "CAP1",
                                 "originalReference": "7914073381342284"},
             {**documented_item(), "pspReference": "OTHER0000000001"}, {**documented_item(), "eventCode": "X"}]
    status, answer = await r.webhook("adyen", adyen.sign_body(items, KEY), {})
    assert (status, answer) == (200, b"[accepted]")
    stored = [(t, k) for t, k, _, _ in appender.records]
    assert stored[:3] == [(topics.raw, b"adyen:7914073381342284")] * 2 + [(topics.raw, b"adyen:OTHER0000000001")]
    assert stored[3][0] == topics.quarantine  # an event code not handled: set aside, still accepted
    assert all(CHECKED in h for t, _, _, h in appender.records if t == topics.raw)
    assert len({dict(h)["delivery_id"] for *_, h in appender.records}) == 4


async def test_one_item_not_stored_makes_it_503_and_a_bad_signature_401_with_nothing_stored() -> None:
    appender = Appender(fail_on=1)
    r, _ = receiver(appender)
    body = adyen.sign_body([documented_item(), {**documented_item(), "pspReference": "P2"}], KEY)
    status, _ = await r.webhook("adyen", body, {})
    assert status == 503
    appender = Appender()
    r, _ = receiver(appender)
    forged = body.replace(b'"P2"', b'"P3"')
    assert (await r.webhook("adyen", forged, {}))[0] == 401 and appender.records == []


async def test_basic_auth_when_configured() -> None:
    appender = Appender()
    r, _ = receiver(appender, basic="adyen:s3cret")
    body = adyen.sign_body([documented_item()], KEY)
    assert (await r.webhook("adyen", body, {}))[0] == 401 and appender.records == []
    auth = {"Authorization": "Basic " + base64.b64encode(b"adyen:s3cret").decode()}
    assert await r.webhook("adyen", body, auth) == (200, b"[accepted]")


def test_the_workers_dispatch_decides_stored_items_capture_before_authorisation() -> None:
    n = names("t")
    auth = documented_item()
    capture = {**auth, "eventCode": "CAPTURE", "pspReference": "CAP1", "originalReference": auth["pspReference"],
               "eventDate": "2019-05-06T17:15:40+02:00"}
    parts = adyen.split(adyen.sign_body([capture, auth, auth], KEY))
    batch = [Incoming(b"adyen:7914073381342284", record, [*raw_headers("adyen", f"d{i}", 1_700_000_000_000), CHECKED],
                      i, 0, n.raw) for i, (record, _) in enumerate(parts)]
    plan = plan_batch(n, registry.GATEWAYS, batch, lambda partition, key: None)
    decided = [orjson.loads(r[2]) for r in plan.records[0] if r[0] == n.decisions]
    assert [d["outcome"] for d in decided] == ["parked", "applied", "unparked", "duplicate"] and not plan.set_aside
    row = next(d["row"] for d in decided if d["outcome"] == "applied")
    assert (row["state"], row["captured_minor"], row["merchant_reference"]) == (
        "captured", 1130, "TestPayment-1407325143704")
    effects = [orjson.loads(r[2])["dedupe_key"] for r in plan.records[0] if r[0] == n.effects]
    assert effects == ["adyen:7914073381342284:mark_order_paid"]


def test_a_key_that_is_not_hex_is_refused_at_start() -> None:
    validate_secrets(dev_settings({"ORDERLY_SECRET_ADYEN": f"{KEY},{OLD_KEY}"}))
    with pytest.raises(ValueError, match="adyen secret is not a hex key"):
        validate_secrets(dev_settings({"ORDERLY_SECRET_ADYEN": f"{KEY},not-hex"}))


async def test_a_request_counts_once_and_each_quarantined_item_in_its_own_metric() -> None:
    r, _ = receiver(Appender())
    await r.webhook("adyen", adyen.sign_body([documented_item(), {**documented_item(), "eventCode": "X"}], KEY), {})
    requests = r.metrics.requests
    assert requests.labels("adyen", "stored")._value.get() == 1
    assert requests.labels("adyen", "quarantined")._value.get() == 0
    assert r.metrics.quarantined.labels("adyen", "unknown_type")._value.get() == 1
