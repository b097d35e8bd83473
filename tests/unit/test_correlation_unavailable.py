"""The correlation API's 503 when PostgreSQL is away (app/ingest/correlations.py): its answer, on the
internet-facing port, says what is away and the error's type only, never the exception's text (an
internal address, a user name), as /readyz there does (app/ingest/readiness.py's public_reason);
the ingest's log keeps the text in full, at most a few lines a minute."""

from __future__ import annotations

import logging
from typing import cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.ingest.appender import Appender
from app.ingest.correlation_store import CorrelationStore
from app.ingest.correlations import CorrelationRoute
from app.logs import SampledLog
from app.metrics import IngestMetrics
from tests.support import make_settings
from topics.catalog import names

DSN = "postgresql://orderly-user:pw@127.0.0.1:1/orderly"  # nothing listens: refused at once


async def test_postgres_away_is_answered_without_its_address_or_user(caplog: pytest.LogCaptureFixture) -> None:
    settings = make_settings("127.0.0.1:1", DSN, "orderly")
    refusals = SampledLog(logging.getLogger("orderly.ingest"), first=2)
    route = CorrelationRoute(settings, IngestMetrics(), CorrelationStore(DSN, "orderly"), cast(Appender, None),
                             names("orderly"), refusals)
    app = web.Application()
    app.router.add_put("/correlations/pg/deposits/{deposit_id}", route.put)
    async with TestClient(TestServer(app)) as client:
        with caplog.at_level(logging.WARNING, "orderly.ingest"):
            for _ in range(3):
                answer = await client.put(
                    "/correlations/pg/deposits/dep_1", headers={"Authorization": "Bearer test-token"},
                    json={"merchant_reference": "r", "our_order_id": "o", "our_user_id": "u"})
                body = await answer.json()
                assert answer.status == 503
                assert body["detail"] == "postgres unreachable: ConnectionRefusedError", body
    # the operator's side: the cause with its text (the port it tried), twice, the third counted
    # (only this route's lines: a thread left by an earlier test of the process may log to the same logger)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("503 correlation dep_1")]
    assert len(lines) == 2, lines
    assert all(line.startswith("503 correlation dep_1: postgres unreachable:") and "127.0.0.1" in line
               for line in lines), lines
