"""The Helm chart's files that must agree with the rest of the repository, without helm: its alert
rules are docker/alerts.yml's (one source: the chart keeps a copy because a chart is packaged on its
own, and this test holds the copy to the original), and its default gateways cover the registry's."""

from __future__ import annotations

from pathlib import Path

import yaml

from app.settings import GATEWAYS

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
