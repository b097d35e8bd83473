"""ORDERLY_GATEWAYS (DESIGN.md §2.7) at the ingest's app factory: a disabled gateway's webhook route and
its other routes (pg's correlations) answer 404, and only the enabled gateways' secrets are needed."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from app.ingest.app import RECEIVER, create_app
from app.settings import DEV_DEFAULTS, Settings

WITHOUT_SECRETS = {k: v for k, v in DEV_DEFAULTS.items() if not k.startswith("ORDERLY_SECRET_")}


def ingest(gateways: str, **secrets: str) -> web.Application:
    env = {**WITHOUT_SECRETS, "ORDERLY_GATEWAYS": gateways,
           **{f"ORDERLY_SECRET_{name.upper()}": value for name, value in secrets.items()}}
    return create_app(Settings.from_env(env))


async def status(app: web.Application, method: str, path: str) -> int:
    """The status the app's router gives a request before any handler that needs Kafka runs."""
    request = make_mocked_request(method, path, app=app)
    match = await app.router.resolve(request)
    if match.http_exception is not None:
        return match.http_exception.status
    if path.startswith("/webhooks/") and not app[RECEIVER].serves(match.get("gateway", "")):
        answer = await app[RECEIVER].receive(make_mocked_request(method, path, app=app, match_info=dict(match)))
        return answer.status  # refused before the body is read
    return 200  # routed to a handler that serves it


def test_with_pg_only_only_pgs_secret_is_needed_and_the_other_webhooks_are_404() -> None:
    app = ingest("pg", pg="only-pg-secret")
    assert asyncio.run(status(app, "POST", "/webhooks/pg")) == 200
    assert asyncio.run(status(app, "POST", "/webhooks/card")) == 404
    assert asyncio.run(status(app, "POST", "/webhooks/paymos")) == 404
    assert asyncio.run(status(app, "PUT", "/correlations/pg/deposits/dep_1")) == 200


def test_a_disabled_gateways_other_routes_are_404() -> None:
    app = ingest("card,paymos", card=DEV_DEFAULTS["ORDERLY_SECRET_CARD"], paymos="p")
    assert asyncio.run(status(app, "PUT", "/correlations/pg/deposits/dep_1")) == 404
    assert asyncio.run(status(app, "POST", "/webhooks/pg")) == 404
    assert asyncio.run(status(app, "POST", "/webhooks/card")) == 200


def test_an_enabled_gateways_secret_is_still_checked_at_start() -> None:
    try:
        ingest("card", card="not-a-whsec-key")
    except ValueError as refused:
        assert "whsec" in str(refused) or "base64" in str(refused)
    else:
        raise AssertionError("a card secret that is not a Standard Webhooks key was accepted")
    ingest("pg", pg="x", card="not-a-whsec-key")  # card disabled: its (unread) secret is not checked
