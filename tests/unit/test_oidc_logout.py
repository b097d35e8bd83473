"""Sign-out at the issuer (OpenID Connect RP-Initiated Logout 1.0): the URL the console sends the
browser to, from the discovery document as kept (app/admin/oidc.Issuer.end_session_url; the whole
flow runs against Keycloak in tests/e2e/test_oidc.py)."""

from __future__ import annotations

from typing import Any

from yarl import URL

from app.admin.oidc import Issuer, SignInError

ISSUER = "https://id.example/realms/r"


def issuer(meta: dict[str, Any] | None) -> Issuer:
    made = Issuer(ISSUER, "orderly-admin", "s3cret", "https://admin.example/auth/callback")
    made._meta = meta  # as fetched from the discovery document
    return made


async def test_the_end_session_url_carries_the_hint_the_client_and_where_to_come_back() -> None:
    meta = {"issuer": ISSUER, "end_session_endpoint": f"{ISSUER}/protocol/openid-connect/logout"}
    url = URL(await issuer(meta).end_session_url("a.b.c", "https://admin.example/login") or "")
    assert str(url.with_query(None)) == meta["end_session_endpoint"]
    assert dict(url.query) == {"id_token_hint": "a.b.c", "client_id": "orderly-admin",
                               "post_logout_redirect_uri": "https://admin.example/login"}
    # an endpoint with a query of its own keeps it
    meta["end_session_endpoint"] = "https://id.example/logout?tenant=t1"
    url = URL(await issuer(meta).end_session_url("a.b.c", "https://admin.example/login") or "")
    assert url.query["tenant"] == "t1" and url.query["id_token_hint"] == "a.b.c"


async def test_no_endpoint_or_an_unusable_one_means_signing_out_here_only() -> None:
    assert await issuer({"issuer": ISSUER}).end_session_url("a.b.c", "https://admin.example/login") is None
    for bad in (42, "javascript:alert(1)", "/relative/logout"):
        meta = {"issuer": ISSUER, "end_session_endpoint": bad}
        assert await issuer(meta).end_session_url("a.b.c", "https://admin.example/login") is None, bad

    class Unreachable(Issuer):
        async def metadata(self) -> dict[str, Any]:
            raise SignInError("the issuer is not reachable")

    gone = Unreachable(ISSUER, "orderly-admin", None, "https://admin.example/auth/callback")
    assert await gone.end_session_url("a.b.c", "https://admin.example/login") is None
