"""A payment parked longer than ORDERLY_PARKED_ALERT_AFTER_S is shown to the operator (DESIGN §2.6:
adyen has no fetch): the setting, the projector's gauge per gateway, the console's parked page.
The SQL that decides ``overdue`` runs against PostgreSQL in tests/e2e/test_parked_overdue.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from prometheus_client import generate_latest

from app.admin.console import ENV
from app.gateways import registry
from app.metrics import ProjectorMetrics
from app.projector import PARKED_BY_GATEWAY, Projector
from app.settings import DEV_DEFAULTS, TABLE, Settings
from projections import sql


def test_the_setting_defaults_to_an_hour_and_reads_from_the_environment() -> None:
    row = next(r for r in TABLE if r.field == "parked_alert_after_s")
    assert (row.env, row.default) == ("ORDERLY_PARKED_ALERT_AFTER_S", 3600.0)
    assert Settings.from_env(DEV_DEFAULTS).parked_alert_after_s == 3600.0
    assert Settings.from_env({**DEV_DEFAULTS, "ORDERLY_PARKED_ALERT_AFTER_S": "2.5"}).parked_alert_after_s == 2.5


class FakePool:
    """Answers the projector's gauge queries, and keeps the arguments they were asked with."""

    def __init__(self, parked: list[dict[str, Any]]) -> None:
        self.parked = parked
        self.asked: list[tuple[str, tuple[Any, ...]]] = []

    async def fetch(self, query: str, *args: Any) -> list[dict[str, Any]]:
        self.asked.append((query, args))
        return self.parked if query == PARKED_BY_GATEWAY else []

    async def fetchrow(self, query: str, *args: Any) -> tuple[int, int] | None:
        self.asked.append((query, args))
        return (3, 7) if query == sql.GAPS_OPEN else None


class FakeSink:
    name, topic = "projector", "orderly.decisions"

    def __init__(self, pool: FakePool) -> None:
        self.pool = pool

    async def lag(self) -> int:
        return 0


def gauge(metrics: ProjectorMetrics, name: str, gateway: str) -> float | None:
    value = metrics.registry.get_sample_value(name, {"gateway": gateway})
    return value


def test_the_projector_exports_overdue_resources_per_gateway_with_the_setting() -> None:
    projector = Projector.__new__(Projector)
    projector.settings = Settings.from_env({**DEV_DEFAULTS, "ORDERLY_PARKED_ALERT_AFTER_S": "90"})
    projector.metrics = ProjectorMetrics()
    pool = FakePool([{"gateway": "adyen", "resources": 3, "events": 4, "oldest_s": 120.0, "overdue": 2}])
    projector.sink = projector.quarantine = FakeSink(pool)  # type: ignore[assignment]
    asyncio.run(projector.read_gauges())
    assert (PARKED_BY_GATEWAY, (90.0,)) in pool.asked  # the setting, in seconds, is the query's bound
    assert gauge(projector.metrics, "orderly_parked_overdue_resources", "adyen") == 2
    # every other gateway is set too, at 0: an alert sees the value fall back, not the series vanish
    assert {g: gauge(projector.metrics, "orderly_parked_overdue_resources", g) for g in registry.GATEWAYS
            if g != "adyen"} == {g: 0 for g in registry.GATEWAYS if g != "adyen"}
    assert b"orderly_parked_overdue_resources{gateway=\"adyen\"} 2.0" in generate_latest(projector.metrics.registry)
    # the open pg gaps and the numbers they miss, of the gateways whose sequence is backfilled
    assert (sql.GAPS_OPEN, (["pg"],)) in pool.asked
    assert projector.metrics.registry.get_sample_value("orderly_pg_sequence_gaps_open") == 3
    assert projector.metrics.registry.get_sample_value("orderly_pg_sequence_missing") == 7
    # the count is of resources whose oldest parked delivery is older than the bound
    assert "received_at < now() - make_interval(secs => $1)" in PARKED_BY_GATEWAY


def test_the_parked_page_marks_the_overdue_resources_and_names_the_setting() -> None:
    since = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
    items = [{"gateway": "adyen", "resource_id": "PSP_LATE", "deliveries": 1, "parked_since": since,
              "first_event_type": "CAPTURE", "why": "waits for the AUTHORISATION", "overdue": True},
             {"gateway": "adyen", "resource_id": "PSP_FRESH", "deliveries": 1, "parked_since": since,
              "first_event_type": "REFUND", "why": "waits for the AUTHORISATION", "overdue": False}]
    frame = {"csrf": "", "path": "/parked", "flash": None, "refused": None, "gateways": list(registry.GATEWAYS),
             "namespace": "orderly", "signed_in": True, "delivering": False, "fetched": [], "sequenced": [],
             "fetchable": [], "backfilled": [], "identity": SimpleNamespace(person="ada", role="viewer"),
             "break_glass_on": False}  # what console.render gives every page
    page = ENV.get_template("parked.html").render(items=items, fetch_after_s=60, alert_after_s=7200, **frame)
    rows = {line.split("PSP_")[1][:4]: line for line in page.splitlines() if "PSP_" in line}
    assert 'class="overdue">overdue' in rows["LATE"] and "overdue" not in rows["FRES"]
    assert "longer than 7200 s (ORDERLY_PARKED_ALERT_AFTER_S)" in page
