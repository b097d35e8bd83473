"""The operator's files (issue #48 item 5): every alert names its runbook section in
docs/operations.md and that section exists; the dashboard filters by namespace and gateway; the
raw topic's retention comes from its setting."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from app import metrics
from app.setting_kinds import SettingsError
from app.settings import DEV_DEFAULTS, Settings
from topics.catalog import FOREVER, catalog, names

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    found = set()
    for line in markdown.splitlines():
        if match := re.match(r"^#{1,6} (.+)$", line):
            found.add(slug(match.group(1)))
    return found


def rules(path: Path) -> list[dict[str, object]]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_the_slug_is_githubs() -> None:
    assert slug("Bulk retry and redrive") == "bulk-retry-and-redrive"
    assert slug("Personal data: retention and erasure") == "personal-data-retention-and-erasure"
    assert slug("OrderlyEffectDead") == "orderlyeffectdead"


def test_every_alert_has_a_runbook_url_to_a_section_of_the_operations_runbook() -> None:
    sections = anchors(OPERATIONS.read_text())
    found = rules(ROOT / "docker" / "alerts.yml")
    assert len(found) == 17
    for rule in found:
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        url = annotations.get("runbook_url")
        assert isinstance(url, str), f"{rule['alert']} has no runbook_url"
        path, _, anchor = url.partition("#")
        assert path == "docs/operations.md", url
        assert anchor == str(rule["alert"]).lower(), f"{rule['alert']}: its own section, not {anchor}"
        assert anchor in sections, f"{rule['alert']}: docs/operations.md has no heading for #{anchor}"
    assert (ROOT / "deploy/helm/orderly/files/alerts.yml").read_bytes() == (ROOT / "docker/alerts.yml").read_bytes()


def test_a_missing_anchor_would_be_found() -> None:
    assert "orderlyeffectdead" in anchors("## Alerts\n### OrderlyEffectDead\ntext")
    assert "orderlyeffectdead" not in anchors("## Alerts\nOrderlyEffectDead is not a heading")


def gateway_series() -> set[str]:
    """Every series name some registry exports with a ``gateway`` label (a labelled metric has no
    sample before its first child, so its declared label names are read)."""
    found: set[str] = set()
    for kind in (metrics.IngestMetrics, metrics.WorkerMetrics, metrics.ProjectorMetrics, metrics.EffectsMetrics,
                 metrics.FetcherMetrics, metrics.AdminMetrics):
        for collector, series in kind().registry._collector_to_names.items():
            if "gateway" in getattr(collector, "_labelnames", ()):
                found |= set(series)
    return found


def test_the_dashboard_has_namespace_and_gateway_variables_and_every_query_uses_them() -> None:
    dashboard = json.loads((ROOT / "docker" / "grafana" / "dashboards" / "orderly.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"namespace", "gateway"}
    for variable in variables.values():
        assert variable["includeAll"] and variable["allValue"] == ".*" and variable["multi"]
        assert variable["datasource"]["uid"] == "prometheus"
    assert variables["gateway"]["query"]["query"] == "label_values(orderly_worker_decisions_total, gateway)"
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert exprs
    selector = re.compile(r"\b((?:orderly|process)_[a-z0-9_]+|up)\{([^}]*)\}")
    for expr in exprs:
        selected = selector.findall(expr)
        assert selected, expr
        for name, matchers in selected:
            assert 'namespace=~"$namespace"' in matchers, expr
            labelled = name in gateway_series()
            assert ('gateway=~"$gateway"' in matchers) == labelled, expr
    assert any('gateway=~"$gateway"' in e for e in exprs)


def test_the_raw_topics_retention_is_its_setting_and_for_ever_unset() -> None:
    assert Settings.from_env(DEV_DEFAULTS).raw_retention_ms is None
    assert Settings.from_env({**DEV_DEFAULTS, "ORDERLY_RAW_RETENTION_MS": "604800000"}).raw_retention_ms == 604800000
    with pytest.raises(SettingsError, match="ORDERLY_RAW_RETENTION_MS"):  # less than a day
        Settings.from_env({**DEV_DEFAULTS, "ORDERLY_RAW_RETENTION_MS": "3600000"})
    by_name = {s.name: s for s in catalog("orderly")}
    assert by_name[names().raw].config["retention.ms"] == FOREVER
    week = 7 * 86_400_000
    by_name = {s.name: s for s in catalog("orderly", raw_retention_ms=week)}
    assert by_name[names().raw].config["retention.ms"] == str(week)
    assert by_name[names().raw].config["retention.bytes"] == FOREVER
    assert by_name[names().quarantine].config["retention.ms"] == FOREVER  # erased by hand: docs/operations.md
