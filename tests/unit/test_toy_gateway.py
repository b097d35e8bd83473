"""One registry line and the gateway's own module are all a gateway takes (DESIGN.md §2.7): with
tests/toy_gateway.py's TOY registered, and nothing else changed, the ingest serves it when enabled
(and only then), `simulate --check` generates, decides and checks its histories, the console's
queries, replay and the gateway-name rule take it in."""

from __future__ import annotations

import argparse
import asyncio
import io
import random
from collections.abc import Iterator
from dataclasses import replace

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from app import replay
from app.admin import queries
from app.gateways import registry
from app.ingest.app import RECEIVER, create_app
from app.settings import Secret, dev_settings
from app.simulator import check, cli, plugins
from tests import toy_gateway
from tests.unit import test_gateway_names


@pytest.fixture(autouse=True)
def toy_registered() -> Iterator[None]:
    registry.register(toy_gateway.TOY)  # the one line
    yield
    registry.unregister(toy_gateway.NAME)


def served(app: web.Application, gateway: str) -> int:
    """The status of a webhook of ``gateway`` up to its body (404 is answered before reading it)."""
    if app[RECEIVER].serves(gateway):
        return 200
    request = make_mocked_request("POST", f"/webhooks/{gateway}", app=app, match_info={"gateway": gateway})
    return asyncio.run(app[RECEIVER].receive(request)).status


def test_the_ingest_serves_it_when_enabled_and_only_then() -> None:
    # ORDERLY_GATEWAYS knows the names registered when it is read; a secret row exists for the
    # gateways registered when the settings were declared, so the toy's secret is given directly
    on = dev_settings({"ORDERLY_GATEWAYS": "toy,pg"})
    assert on.gateways == ("pg", "toy")
    app = create_app(on.with_overrides(secrets={**on.secrets, "toy": Secret(("toy-secret",))}))
    assert (served(app, "toy"), served(app, "pg"), served(app, "card")) == (200, 200, 404)
    off = dev_settings({"ORDERLY_GATEWAYS": "pg"})
    assert served(create_app(off), "toy") == 404


def test_simulate_check_generates_decides_and_checks_its_histories() -> None:
    assert "toy" in plugins.simulated()
    report = check.check_gateway("toy", 300, 1)
    assert report.histories == 300 and report.deliveries > 300 and not report.mismatches
    out = io.StringIO()
    args = argparse.Namespace(gateway="toy", target=None, histories=50, seed=3, tag=None)
    assert cli.check_command(dev_settings({}), args, out) == 0
    assert "toy: 50 histories" in out.getvalue() and "check: histories=50 mismatches=0" in out.getvalue()


def test_its_oracle_catches_a_reducer_that_breaks_the_version_guard() -> None:
    """The check is not vacuous: a toy that applies stale snapshots mismatches."""
    history = next(h for h in (toy_gateway.generate(random.Random(s), s, str(s)) for s in range(50))
                   if [d.event for d in h.deliveries] != sorted(d.event for d in h.deliveries))
    assert check.mismatch(history) == []
    forgetful = replace(toy_gateway.TOY.reducer, apply_event=lambda state, event, d: toy_gateway.apply_event(
        None, event, d))  # every snapshot applies: no guard
    registry.register(replace(toy_gateway.TOY, reducer=forgetful))
    try:
        assert check.mismatch(history)
    finally:
        registry.register(toy_gateway.TOY)


def test_the_console_replay_and_the_name_rule_take_it_in() -> None:
    assert "toy_things" in replay.compared()
    assert "FROM toy_things" in queries.status_union()
    assert queries.parked_because("toy") == "a toy thing never waits"
    assert toy_gateway.TOY.state_queries() == [("thing", "SELECT * FROM toy_things WHERE id = $1")]
    # quoted only in tests/: nothing in app/ had to name it
    assert not [line for lines in test_gateway_names.offences().values() for line in lines if "'toy'" in line]
