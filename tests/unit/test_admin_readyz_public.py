"""The admin's /readyz needs no credential (app/admin/guard.py PUBLIC): PostgreSQL away, it names what
it waits for and the error's type, never the error's text (an internal address, a user name), as the
ingest's /readyz does (app/ingest/readiness.py public_reason); the admin's log has the text."""

from __future__ import annotations

from types import SimpleNamespace

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.admin import api
from app.admin.context import ADMIN
from app.readiness import Readiness


class AwayPool:
    async def fetchval(self, query: str) -> object:
        raise ConnectionRefusedError(111, "Connect call failed ('10.9.8.7', 5432)")


async def test_the_public_readyz_says_the_error_s_type_not_its_text() -> None:
    app = web.Application()
    app[ADMIN] = SimpleNamespace(pool=AwayPool(), readiness=Readiness())  # type: ignore[misc]
    app.router.add_get("/readyz", api.readyz)
    async with TestClient(TestServer(app)) as client:
        answer = await client.get("/readyz")
        body = await answer.json()
    assert answer.status == 503
    assert body["waiting_for"]["postgres"]["reason"] == "ConnectionRefusedError", body
