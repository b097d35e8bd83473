"""The correlation API's 503 when PostgreSQL is away (app/ingest/correlations.py): its answer, on the
internet-facing port, says what is away and the error's type only, never the exception's text (an
internal address, a user name), as /readyz there does (app/ingest/readiness.py's public_reason);
the ingest's readiness log keeps the text in full."""

from __future__ import annotations

from typing import cast

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.ingest.appender import Appender
from app.ingest.correlations import CorrelationRoute, CorrelationStore
from app.metrics import IngestMetrics
from tests.support import make_settings
from topics.catalog import names

DSN = "postgresql://orderly-user:pw@127.0.0.1:1/orderly"  # nothing listens: refused at once


async def test_postgres_away_is_answered_without_its_address_or_user() -> None:
    settings = make_settings("127.0.0.1:1", DSN, "orderly")
    route = CorrelationRoute(settings, IngestMetrics(), CorrelationStore(DSN, "orderly"), cast(Appender, None),
                             names("orderly"))
    app = web.Application()
    app.router.add_put("/correlations/pg/deposits/{deposit_id}", route.put)
    async with TestClient(TestServer(app)) as client:
        answer = await client.put("/correlations/pg/deposits/dep_1", headers={"Authorization": "Bearer test-token"},
                                  json={"merchant_reference": "r", "our_order_id": "o", "our_user_id": "u"})
        body = await answer.json()
    assert answer.status == 503
    assert body["detail"] == "postgres unreachable: ConnectionRefusedError", body
