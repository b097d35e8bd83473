"""The admin's pure checks (app/admin/auth.py, safe_next): flash MACs bound to what they sign and a
server key, roles from groups, each route's role, trusted proxies, the wrong-token throttle (bounded),
and no open redirect from any `next`."""

from __future__ import annotations

from urllib.parse import urlsplit

from hypothesis import given
from hypothesis import strategies as st

from app.admin import auth
from app.admin.http import safe_next

KEY = b"k" * 32


def test_flash_macs_are_bound_to_what_they_sign_and_to_the_server_key() -> None:
    mac = auth.flash_mac(KEY, "done:retried")
    assert auth.flash_ok(KEY, "done:retried", mac)
    assert not auth.flash_ok(KEY, "refused:retried", mac)
    assert not auth.flash_ok(b"x" * 32, "done:retried", mac)
    assert not auth.flash_ok(KEY, "done:retried", None)


def test_csrf_and_break_glass_compare_exactly_and_an_unset_token_matches_nothing() -> None:
    assert auth.csrf_ok("abc", "abc") and not auth.csrf_ok("abc", "abd")
    assert not auth.csrf_ok("abc", None) and not auth.csrf_ok("abc", "")
    assert auth.token_ok("break-glass-token", "break-glass-token")
    assert not auth.token_ok("break-glass-token", "break-glass-tokeN")
    assert not auth.token_ok(None, "") and not auth.token_ok("", "") and not auth.token_ok(None, None)
    assert auth.bearer("Bearer abc") == "abc" and auth.bearer("Basic abc") is None and auth.bearer(None) is None


ROLE_MAP = auth.parse_role_map("viewers=viewer,ops=operator,admins=admin, spaced = operator")


def test_the_role_map_gives_the_highest_role_of_any_group() -> None:
    assert ROLE_MAP == {"viewers": "viewer", "ops": "operator", "admins": "admin", "spaced": "operator"}
    assert auth.role_of(["viewers"], ROLE_MAP) == "viewer"
    assert auth.role_of(["viewers", "admins", "ops"], ROLE_MAP) == "admin"
    assert auth.role_of(["/ops"], ROLE_MAP) == "operator"  # a group's full path, as some issuers send it
    assert auth.role_of("ops", ROLE_MAP) == "operator"
    assert auth.role_of(["strangers"], ROLE_MAP) is None
    assert auth.role_of(None, ROLE_MAP) is None and auth.role_of({"ops": 1}, ROLE_MAP) is None


@given(st.lists(st.sampled_from(["viewers", "ops", "admins", "x", "/admins"]), max_size=5))
def test_a_role_never_exceeds_the_highest_group_given(groups: list[str]) -> None:
    role = auth.role_of(groups, ROLE_MAP)
    given_roles = [ROLE_MAP[g.lstrip("/")] for g in groups if g.lstrip("/") in ROLE_MAP]
    assert (role is None) == (not given_roles)
    assert role is None or auth.rank(role) == max(auth.rank(r) for r in given_roles)


def test_each_route_needs_the_role_design_gives_it() -> None:
    assert auth.required_role("GET", "/api/overview") == "viewer"
    assert auth.required_role("GET", "/api/quarantine") == "viewer"
    assert auth.required_role("GET", "/api/quarantine/d-1") == "operator"  # a raw body
    assert auth.required_role("GET", "/quarantine/d-1") == "operator"
    assert auth.required_role("POST", "/api/effects/k/retry") == "operator"
    assert auth.required_role("POST", "/logout") == "viewer"
    assert auth.required_role("GET", "/api/tokens") == "admin"
    assert auth.required_role("GET", "/tokens") == "admin"  # the console's tokens page, as the API
    assert auth.required_role("POST", "/tokens/3/revoke") == "admin"
    assert auth.required_role("GET", "/api/audit") == "viewer"


def test_the_source_address_believes_only_trusted_proxies() -> None:
    proxies = auth.trusted("10.0.0.0/8,127.0.0.1")
    assert auth.source("203.0.113.9", "1.2.3.4", proxies) == "203.0.113.9"  # not a proxy: its own address
    assert auth.source("10.1.1.1", "1.2.3.4, 10.2.2.2", proxies) == "1.2.3.4"
    assert auth.source("10.1.1.1", "6.6.6.6, 1.2.3.4", proxies) == "1.2.3.4"  # what the client wrote is not believed
    assert auth.source("10.1.1.1", None, proxies) == "10.1.1.1"
    assert auth.source("10.1.1.1", "1.2.3.4", []) == "10.1.1.1"
    assert auth.secure(False, "10.1.1.1", "https", proxies) and not auth.secure(False, "8.8.8.8", "https", proxies)
    assert auth.secure(True, None, None, []) and not auth.secure(False, "10.1.1.1", "http", proxies)


def test_the_throttle_forgets_the_least_recent_address_past_its_bound() -> None:
    throttle = auth.LoginThrottle(most=3)
    for n in range(5):
        throttle.failed(f"10.0.0.{n}", 1.0)
    assert list(throttle.failures) == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]


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
