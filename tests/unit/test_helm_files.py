"""The Helm chart's files that must agree with the rest of the repository, without helm: its alert
rules are docker/alerts.yml's (one source: the chart keeps a copy because a chart is packaged on its
own, and this test holds the copy to the original), its default gateways cover the registry's, and
the routes its probes are held to (tests/served_routes.py) are read from the code."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.settings import GATEWAYS
from tests import served_routes
from tests.served_routes import served

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "orderly"


def test_the_charts_alert_rules_are_a_copy_of_dockers() -> None:
    copy, original = CHART / "files" / "alerts.yml", ROOT / "docker" / "alerts.yml"
    assert copy.read_bytes() == original.read_bytes(), f"cp {original.relative_to(ROOT)} {copy.relative_to(ROOT)}"


def test_the_prometheus_rule_template_reads_the_copy() -> None:
    template = (CHART / "templates" / "monitoring.yaml").read_text(encoding="utf-8")
    assert '.Files.Get "files/alerts.yml"' in template


def test_the_default_gateways_cover_the_registry() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert set(GATEWAYS) <= set(values["gateways"])
    # each process requires only what it uses (app/setting_uses.py): no switch to give every one every secret
    assert "everyProcessRequiresEverySecret" not in values


def test_the_routes_the_charts_probes_are_held_to_come_from_the_code() -> None:
    """tests/integration/test_helm_chart.py holds every probe to these: /readyz beside /metrics where
    the process hands its readiness to the metrics port, the admin's and the ingest's on their own."""
    for process in ("projector", "effects", "fetcher"):
        assert served(process) == {"metrics": {"/metrics", "/readyz"}}, process
    assert served("worker") == {"metrics": {"/metrics"}}  # Faust's port: no readiness
    admin, ingest = served("admin"), served("ingest")
    assert {"/healthz", "/readyz"} <= admin["admin"] and admin["metrics"] == {"/metrics"}
    assert {"/healthz", "/readyz"} <= ingest["http"] and ingest["metrics"] == {"/metrics"}
    assert "/metrics" not in ingest["http"] | admin["admin"]


@pytest.mark.parametrize(("call", "ready"), [
    ("start_service(started, x, r, 9100, host)", False),
    ("start_service(started, x, r, 9100, host, readiness)", True),
    ("start_service(started, x, r, port=9100, host=host, readiness=readiness)", True),
    ("serve_metrics(r, 9100, host)", False),
    ("serve_metrics(r, 9100, host, readiness)", True),
    ("pass", None),
])
def test_a_readiness_handed_to_the_metrics_port_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         call: str, ready: bool | None) -> None:
    module = tmp_path / "process.py"
    module.write_text(f"async def run():\n    await metrics.{call}\n" if call != "pass" else "pass\n",
                      encoding="utf-8")
    monkeypatch.setitem(served_routes.MODULES, "projector", str(module))
    assert served_routes.passes_readiness("projector") is ready
