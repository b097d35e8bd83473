"""The admin's pure checks (app/admin/auth.py, safe_next): sessions, CSRF and flash MACs bound to
what they sign, the wrong-token throttle, and no open redirect from any `next`."""

from __future__ import annotations

from urllib.parse import urlsplit

from hypothesis import given
from hypothesis import strategies as st

from app.admin import auth
from app.admin.http import safe_next

TOKEN = "admin-token-for-tests"


def test_a_session_is_valid_until_it_expires_and_only_under_its_token() -> None:
    cookie = auth.new_session(TOKEN, now=1_000)
    assert auth.session_ok(TOKEN, cookie, now=1_000 + auth.SESSION_S - 1)
    assert not auth.session_ok(TOKEN, cookie, now=1_000 + auth.SESSION_S)
    assert not auth.session_ok("another-token", cookie, now=1_001)


@given(st.integers(0, 2), st.characters(codec="ascii"))
def test_a_session_changed_anywhere_is_refused(part: int, char: str) -> None:
    cookie = auth.new_session(TOKEN, now=1_000)
    pieces = cookie.split(".")
    changed = pieces[part][:-1] + char
    if changed == pieces[part]:
        return
    pieces[part] = changed
    assert not auth.session_ok(TOKEN, ".".join(pieces), now=1_001)


def test_csrf_and_flash_macs_are_bound_to_what_they_sign() -> None:
    one, two = auth.new_session(TOKEN), auth.new_session(TOKEN)
    assert auth.csrf_ok(TOKEN, one, auth.csrf_token(TOKEN, one))
    assert not auth.csrf_ok(TOKEN, one, auth.csrf_token(TOKEN, two))
    assert not auth.csrf_ok(TOKEN, one, None) and not auth.csrf_ok(TOKEN, one, "")
    mac = auth.flash_mac(TOKEN, "done:retried")
    assert auth.flash_ok(TOKEN, "done:retried", mac)
    assert not auth.flash_ok(TOKEN, "refused:retried", mac)
    assert not auth.flash_ok("another-token", "done:retried", mac)
    assert not auth.flash_ok(TOKEN, "done:retried", None)


def test_the_throttle_refuses_an_address_after_ten_failures_until_they_age_out() -> None:
    throttle = auth.LoginThrottle()
    for second in range(10):
        assert throttle.allowed("10.0.0.1", float(second))
        throttle.failed("10.0.0.1", float(second))
    assert not throttle.allowed("10.0.0.1", 10.0)
    assert throttle.allowed("10.0.0.2", 10.0)  # another address is not affected
    assert throttle.allowed("10.0.0.1", 60.5)  # the first failure has aged out
    assert throttle.allowed("10.0.0.1", 70.0) and "10.0.0.1" not in throttle.failures


@given(st.text(max_size=60) | st.sampled_from(["//evil", "/\\evil", "/\t/evil", "https:evil", "/\n", "/%2F/x",
                                                "///x", " /x", "/ok?a=1#b"]))
def test_next_is_always_a_path_of_this_site(target: str) -> None:
    safe = safe_next(target)
    assert safe.startswith("/") and not safe.startswith("//") and "\\" not in safe
    assert all(0x21 <= ord(c) != 0x7F for c in safe)
    parts = urlsplit(safe)
    assert not parts.scheme and not parts.netloc
    if safe != "/":
        assert safe == target  # a path that passes is kept as it is
