"""POST /api/tokens with a body that is not a JSON object (app/admin/tokens.py): a 400 naming what it
takes, never the 500 (and logged traceback) a hostile client could provoke at will."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.admin import tokens
from app.admin.context import IDENTITY
from app.admin.guard import Handler
from app.admin.http import Refused, problem
from app.admin.sessions import Identity


@web.middleware
async def signed_in(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An admin signed in through the issuer, and a refusal answered as the guard answers it."""
    request[IDENTITY] = Identity("ana", "admin", "oidc")
    try:
        return await handler(request)
    except Refused as exc:
        return problem(exc.status, exc.error)


@pytest.mark.parametrize("body", [b"not json", b"[1]", b'"x"', b"null", b"{", b"\xff"])
async def test_a_body_that_is_no_json_object_is_refused_with_400(body: bytes) -> None:
    app = web.Application(middlewares=[signed_in])
    app.router.add_post("/api/tokens", tokens.create)
    async with TestClient(TestServer(app)) as client:
        answer = await client.post("/api/tokens", data=body, headers={"Content-Type": "application/json"})
        assert answer.status == 400
        assert (await answer.json())["detail"] == "the body must be a JSON object (name, role, expires_days)"
