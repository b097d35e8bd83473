"""Any byte in any header of any gateway is a refusal (401), never an exception (issue #45, item 5).

Both HTTP layers (app/webhook_http.py's fast path and aiohttp's parser) read a header value's bytes
as UTF-8 with surrogate escapes, so a byte that is not UTF-8 reaches an adapter as a lone surrogate,
which ``str.encode`` refuses: card's ``webhook-id`` and adyen's ``Authorization`` raised
UnicodeEncodeError (a 500 and a traceback in the ingest log) before app/gateways/base.py's ``header``.
The running ingest is driven with raw header bytes by tests/e2e/test_hostile.py."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from app.gateways import adyen, registry
from app.gateways.base import SignatureError
from app.ingest.body import encoded
from tests.unit.test_gateway_contract import EXAMPLES, NOW, SECRETS, adyen_item

BASIC = "orderly:basic-secret"


def request(name: str) -> tuple[bytes, dict[str, str]]:
    """A body of gateway ``name`` and the headers that prove it (adyen's proof is inside the body)."""
    found = registry.find(name)
    assert found is not None
    if name == "adyen":
        body = adyen.sign_request(adyen_item("r_1"), SECRETS[name])
        return body, {"Authorization": "Basic " + base64.b64encode(BASIC.encode()).decode()}
    body = EXAMPLES[name]()
    return body, found.adapter.signed_headers(body, SECRETS[name], NOW)


def check(name: str, raw: bytes, headers: dict[str, str]) -> None:
    """What the receiver calls (app/ingest/receiver.py): Basic auth where asked, then the signature."""
    found = registry.find(name)
    assert found is not None
    if name == "adyen":
        adyen.check_basic_auth(headers, BASIC)
    found.adapter.verify(raw, headers, (SECRETS[name],), NOW)


# A header value as the HTTP layers hand it over: any bytes, decoded with surrogate escapes; or any
# text at all (lone surrogates, NUL, other scripts), short or past the 8 KiB a header line may hold.
header_values = st.one_of(
    st.binary(max_size=64).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.text(max_size=64),
    st.sampled_from(["\udcff", "msg_\udc80", "\x00", "v1,\x00", "é", "x" * 9000, "v1," + "A" * 70_000]),
)


@pytest.mark.parametrize("name", sorted(registry.GATEWAYS))
def test_every_gateways_own_request_passes(name: str) -> None:
    raw, headers = request(name)
    check(name, raw, headers)  # else the property below would test refusals of a refused request


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(registry.GATEWAYS)), st.data(), header_values)
def test_any_value_of_any_header_is_refused_or_passes_never_raises_otherwise(
        name: str, data: st.DataObject, value: str) -> None:
    raw, headers = request(name)
    header = data.draw(st.sampled_from(sorted({*headers, "Authorization", "webhook-id", "X-Unrelated"})))
    try:
        check(name, raw, {**headers, header: value})
    except SignatureError as refused:
        assert refused.reason.isascii() and refused.reason  # answered 401 with this reason
    # returning is right too: a header the gateway does not sign, or a value the scheme ignores


@pytest.mark.parametrize("name", sorted(registry.GATEWAYS))
def test_a_byte_that_is_not_utf8_in_a_signed_header_is_refused_by_name(name: str) -> None:
    raw, headers = request(name)
    for header in headers:
        with pytest.raises(SignatureError, match="not ASCII"):
            check(name, raw, {**headers, header: headers[header] + "\udcff"})


@pytest.mark.parametrize(("values", "refused"), [
    ([], False), ([""], False), (["identity"], False), (["Identity "], False), (["gzip"], True), (["GZip"], True),
    (["identity, gzip"], True), (["identity", "br"], True), (["x-\udcff"], True), (["deflate"], True)])
def test_a_body_with_a_content_coding_other_than_identity_is_refused(values: list[str], refused: bool) -> None:
    headers: CIMultiDict[str] = CIMultiDict(("Content-Encoding", v) for v in values)
    assert encoded(headers) is refused
    assert encoded(dict(headers)) is (refused and dict(headers)["Content-Encoding"] != "identity")  # a plain Mapping
