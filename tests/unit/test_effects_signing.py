"""The effects' Standard Webhooks signatures, checked by the `standardwebhooks` package (an
implementation independent of app/signing.py); the jittered retry backoff; the refusal to deliver
unsigned."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks import Webhook, WebhookVerificationError

from app.effects import BACKOFF_CAP_S, EffectsWorker, backoff_ceiling_s, backoff_s, delivery_key
from app.setting_kinds import SettingsError
from app.settings import DEV_DEFAULTS, Secret
from app.signing import signature, signed_headers, signing_key
from tests.support import make_settings

SECRET = DEV_DEFAULTS["ORDERLY_EFFECTS_SECRET"]
# The Standard Webhooks specification's own example.
SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SW_ID, SW_TS, SW_BODY = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
SW_VECTOR = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

keys = st.binary(min_size=1, max_size=64)
ids = st.text(min_size=1, max_size=80)
timestamps = st.integers(min_value=0, max_value=2**33)
bodies = st.text(max_size=2000).map(str.encode)  # the package verifies text: a body is UTF-8 JSON
header_ids = st.from_regex(r"[!-~]{1,80}", fullmatch=True)  # what can travel in an HTTP header


def secret_of(key: bytes) -> str:
    return "whsec_" + base64.b64encode(key).decode()


def test_the_specifications_example() -> None:
    assert signature(signing_key(SW_SECRET), SW_ID, SW_TS, SW_BODY) == SW_VECTOR


@given(keys, ids, timestamps, bodies)
def test_the_signature_is_the_packages(key: bytes, msg_id: str, timestamp: int, body: bytes) -> None:
    expected = Webhook(secret_of(key)).sign(msg_id, datetime.fromtimestamp(timestamp, UTC), body.decode())
    assert signature(signing_key(secret_of(key)), msg_id, timestamp, body) == expected


@given(keys, header_ids, bodies)
def test_the_package_verifies_the_headers(key: bytes, msg_id: str, body: bytes) -> None:
    headers = signed_headers(signing_key(secret_of(key)), msg_id, int(time.time()), body)
    Webhook(secret_of(key)).verify(body, headers, json_parse=False)
    assert headers["webhook-id"] == msg_id


@given(keys, header_ids, bodies, bodies)
def test_another_body_is_refused(key: bytes, msg_id: str, body: bytes, other: bytes) -> None:
    headers = signed_headers(signing_key(secret_of(key)), msg_id, int(time.time()), body)
    if other != body:
        with pytest.raises(WebhookVerificationError):
            Webhook(secret_of(key)).verify(other, headers, json_parse=False)


@given(keys, keys, header_ids, bodies)
def test_another_key_is_refused(key: bytes, other: bytes, msg_id: str, body: bytes) -> None:
    headers = signed_headers(signing_key(secret_of(key)), msg_id, int(time.time()), body)
    if other != key:
        with pytest.raises(WebhookVerificationError):
            Webhook(secret_of(other)).verify(body, headers, json_parse=False)


def test_the_id_and_timestamp_are_signed() -> None:
    key, now = signing_key(SECRET), int(time.time())
    headers = signed_headers(key, "deposit:dep_1:credit_user", now, b"{}")
    for changed in ({"webhook-id": "deposit:dep_2:credit_user"}, {"webhook-timestamp": str(now - 1)}):
        with pytest.raises(WebhookVerificationError):
            Webhook(SECRET).verify(b"{}", {**headers, **changed}, json_parse=False)


@pytest.mark.parametrize("secret", ["whsec_", "", "whsec_not base64!", "whsec_===="])
def test_an_unusable_secret_is_refused(secret: str) -> None:
    with pytest.raises(ValueError):
        signing_key(secret)


def test_unpadded_secrets_are_read() -> None:
    assert signing_key(SW_SECRET.rstrip("=")) == signing_key(SW_SECRET) == base64.b64decode(SW_SECRET[6:])


def test_delivery_without_a_secret_is_refused() -> None:
    settings = make_settings("127.0.0.1:9092", "postgresql://localhost/x", "ns",
                             effects_url="http://merchant.test/effects", effects_secret=None)
    with pytest.raises(SettingsError, match="ORDERLY_EFFECTS_SECRET"):
        delivery_key(settings)
    with pytest.raises(SettingsError, match="ORDERLY_EFFECTS_SECRET"):
        EffectsWorker(settings)


def test_recording_only_needs_no_secret() -> None:
    settings = make_settings("127.0.0.1:9092", "postgresql://localhost/x", "ns", effects_secret=None)
    assert settings.effects_url is None and delivery_key(settings) is None
    signed = settings.with_overrides(effects_url="https://merchant.test/effects", effects_secret=Secret(SECRET))
    assert delivery_key(signed) == signing_key(SECRET)


attempts = st.integers(min_value=0, max_value=10_000)
draws = st.floats(min_value=0.0, max_value=1.0)


@given(attempts, draws)
def test_backoff_stays_between_half_the_ceiling_and_the_ceiling(n: int, draw: float) -> None:
    assert 0 < backoff_ceiling_s(n) / 2 <= backoff_s(n, draw) <= backoff_ceiling_s(n) <= BACKOFF_CAP_S


@given(attempts, attempts)
def test_the_backoff_ceiling_never_falls(a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert backoff_ceiling_s(low) <= backoff_ceiling_s(high)


@given(attempts, attempts, draws)
def test_backoff_is_a_function_of_the_draw(a: int, b: int, draw: float) -> None:
    low, high = sorted((a, b))
    assert backoff_s(low, draw) == backoff_s(low, draw) <= backoff_s(high, draw)


@given(st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=999),
       st.integers(min_value=1, max_value=1000))
def test_backoff_is_jittered(n: int, permille: int, more: int) -> None:
    draw = permille / 1000
    assert backoff_s(n, draw) < backoff_s(n, min(draw + more / 1000, 1.0))


def test_backoff_known_values() -> None:
    assert [backoff_ceiling_s(n) for n in (1, 2, 3, 10, 11, 100)] == [0.5, 1.0, 2.0, 256.0, 300.0, 300.0]
    assert (backoff_s(1, 0.0), backoff_s(1, 1.0), backoff_s(4, 0.5)) == (0.25, 0.5, 3.0)
