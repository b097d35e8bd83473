"""docker/: the compose file, Prometheus's scrape config and rules, Grafana's provisioning and the
Dockerfile hang together. No Docker engine (nor the compose plugin) runs here, so the compose file
is validated against the Compose Specification's own JSON schema (tests/unit/compose-spec.json,
compose-spec/compose-spec@170098ba schema/compose-spec.json) and its structure checked; the rules
and the dashboard's queries are run by a real Prometheus in tests/e2e/test_prometheus.py."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs; a dependency of openapi-spec-validator
import yaml

from app import metrics
from app.cli import COMMANDS
from app.gateways import registry
from tests.served_routes import served

DOCKER = Path(__file__).resolve().parents[2] / "docker"
SCHEMA = Path(__file__).resolve().parent / "compose-spec.json"
ORDERLY = ("ingest", "worker", "projector", "effects", "fetcher", "admin")  # every long-running process
ONE_SHOT = ("migrate",)
KAFKA = ("kafka1", "kafka2", "kafka3")  # brokers
CONTROLLERS = ("controller1", "controller2", "controller3")


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    return loaded


def prometheus() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    return loaded


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_follows_the_compose_specification() -> None:
    assert schema_errors(compose()) == []
    broken = copy.deepcopy(compose())  # the check can fail: a misspelt key and a wrong type are found
    broken["services"]["ingest"]["healthchek"] = {}
    broken["services"]["ingest"]["ports"] = {"8080": 8080}
    assert len(schema_errors(broken)) == 2


def test_three_brokers_and_three_controllers_form_one_replicated_cluster() -> None:
    services = compose()["services"]
    assert sorted(n for n, s in services.items() if str(s.get("image", "")).startswith("apache/kafka:")) == \
        sorted((*CONTROLLERS, *KAFKA))
    envs = [services[name]["environment"] for name in KAFKA]
    controllers = [services[name]["environment"] for name in CONTROLLERS]
    assert [env["KAFKA_NODE_ID"] for env in envs] == ["1", "2", "3"]
    assert [env["KAFKA_NODE_ID"] for env in controllers] == ["101", "102", "103"]
    assert [env["KAFKA_ADVERTISED_LISTENERS"] for env in envs] == [f"PLAINTEXT://{n}:9092" for n in KAFKA]
    assert len({env["CLUSTER_ID"] for env in [*envs, *controllers]}) == 1
    quorum = "101@controller1:9093,102@controller2:9093,103@controller3:9093"
    for env in controllers:
        assert (env["KAFKA_PROCESS_ROLES"], env["KAFKA_LISTENERS"]) == ("controller", "CONTROLLER://:9093")
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == quorum
        assert env["KAFKA_BROKER_SESSION_TIMEOUT_MS"] == "1500"  # the controllers fence a silent broker
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"  # Kafka 4 makes the controllers' value the cluster's
    for env in envs:
        assert env["KAFKA_PROCESS_ROLES"] == "broker"
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == quorum
        assert {k: env[k] for k in ("KAFKA_DEFAULT_REPLICATION_FACTOR", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
                                    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR")} == dict.fromkeys(
            ("KAFKA_DEFAULT_REPLICATION_FACTOR", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
             "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"), "3")
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2"
        assert env["KAFKA_BROKER_HEARTBEAT_INTERVAL_MS"] == "250"
    names = (*KAFKA, *CONTROLLERS)
    volumes = [services[name]["volumes"][0] for name in names]
    assert len({v.split(":")[0] for v in volumes}) == 6, "each node keeps its own log"
    assert all(v.split(":")[1] == services[n]["environment"]["KAFKA_LOG_DIRS"]
               for v, n in zip(volumes, names, strict=True))


def test_orderly_processes_reach_every_broker_with_replication_three() -> None:
    services = compose()["services"]
    for name in (*ORDERLY, *ONE_SHOT):
        env = services[name]["environment"]
        assert env["ORDERLY_KAFKA"].split(",") == [f"{n}:9092" for n in KAFKA], name
        assert (env["ORDERLY_REPLICATION_FACTOR"], env["ORDERLY_MIN_INSYNC_REPLICAS"]) == ("3", "2"), name
        assert env["ORDERLY_METRICS_HOST"] == "0.0.0.0", name
        assert {"ORDERLY_POSTGRES_DSN", "ORDERLY_API_TOKEN", "ORDERLY_GATEWAYS"} <= set(env), name
        # every gateway's secret passed on, optional: ORDERLY_GATEWAYS may leave a gateway (and its secret) out
        for gateway in registry.GATEWAYS:
            variable = f"ORDERLY_SECRET_{gateway.upper()}"
            assert env.get(variable) == f"${{{variable}:-}}", (name, variable)
        assert env["ORDERLY_GATEWAYS"] == "${ORDERLY_GATEWAYS:-}", name
        assert services[name]["command"][0] in COMMANDS, f"{name} runs `orderly {services[name]['command'][0]}`"
    assert services["worker"]["deploy"]["replicas"] == 3
    assert services["admin"]["environment"]["ORDERLY_ADMIN_TOKEN"].startswith("${ORDERLY_ADMIN_TOKEN:?")
    # the admin's OpenID Connect settings, each from the environment (docs/security.md)
    for variable in ("ORDERLY_ADMIN_OIDC_ISSUER", "ORDERLY_ADMIN_OIDC_CLIENT_ID", "ORDERLY_ADMIN_OIDC_CLIENT_SECRET",
                     "ORDERLY_ADMIN_OIDC_REDIRECT_URL", "ORDERLY_ADMIN_ROLES_CLAIM", "ORDERLY_ADMIN_ROLE_MAP"):
        assert services["admin"]["environment"][variable].startswith(f"${{{variable}:-"), variable
    assert services["admin"]["environment"]["ORDERLY_METRICS_PORT"] == "9100"  # /metrics apart from the console
    # the one-shot migrate creates the topics before any process starts
    for name in ORDERLY:
        assert services[name]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}, name


def test_every_service_has_a_healthcheck_of_its_own_endpoint() -> None:
    services = compose()["services"]
    for name, service in services.items():
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        if name in ONE_SHOT:
            assert check == {"disable": True}
            continue
        assert check["test"][0] in ("CMD", "CMD-SHELL") and check["interval"], name
    probes = {name: " ".join(services[name]["healthcheck"]["test"]) for name in ORDERLY}
    assert "127.0.0.1:8080/readyz" in probes["ingest"]
    assert "127.0.0.1:8070/readyz" in probes["admin"]
    for name in ("worker", "projector", "effects", "fetcher"):  # what each serves (tests/served_routes.py)
        port = services[name]["environment"]["ORDERLY_METRICS_PORT"]
        path = "/readyz" if "/readyz" in served(name)["metrics"] else "/metrics"
        assert f"127.0.0.1:{port}{path}" in probes[name], name
    assert "/metrics" in probes["worker"]


def test_compose_references_resolve() -> None:
    document = compose()
    services = document["services"]
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        if "image" in service and "build" not in service:
            assert ":" in service["image"] and not service["image"].endswith(":latest"), "pin images"
        assert set(service.get("depends_on", [])) <= set(services), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DOCKER / source).exists(), source
            else:
                assert source in document["volumes"], source
        if "build" in service:
            assert (DOCKER / service["build"]["context"] / service["build"]["dockerfile"]).exists()
    assert [n for n, s in services.items() if "build" in s] == ["migrate"]  # builds orderly:local once


def test_prometheus_scrapes_every_orderly_process_on_its_metrics_port() -> None:
    services = compose()["services"]
    jobs = {job["job_name"]: job for job in prometheus()["scrape_configs"]}
    assert sorted(jobs) == sorted(f"orderly-{name}" for name in ORDERLY)
    for name in ORDERLY:
        (sd,) = jobs[f"orderly-{name}"]["dns_sd_configs"]
        port = int(services[name]["environment"]["ORDERLY_METRICS_PORT"])  # the admin's too, never its console port
        assert (sd["names"], sd["type"], sd["port"]) == ([name], "A", port), name
    rule_files = prometheus()["rule_files"]
    mounts = services["prometheus"]["volumes"]
    for rule_file in rule_files:
        assert f"./{rule_file}:/etc/prometheus/{rule_file}:ro" in mounts
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_every_alert_has_a_for_a_severity_and_says_what_to_do() -> None:
    groups = yaml.safe_load((DOCKER / "alerts.yml").read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == 17
    for rule in rules:
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        where = r"`orderly [a-z]+|console|/readyz|docker compose|kafka-topics|log"
        assert re.search(where, rule["annotations"]["description"], re.I), f"{rule['alert']} says not where to look"


def test_grafana_provisions_the_prometheus_datasource_and_the_dashboard() -> None:
    services = compose()["services"]
    provisioning = DOCKER / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert (source["type"], source["url"], source["uid"]) == ("prometheus", "http://prometheus:9090", "prometheus")
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "orderly.yml").read_text())["providers"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert mounted[provider["options"]["path"]] == "./grafana/dashboards"
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "orderly.json").read_text())
    targets = [t for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert targets and all(t["datasource"]["uid"] == source["uid"] for t in targets)


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("_info",)}
METRIC = re.compile(r"\b(?:orderly|process|python)_[a-z0-9_]+\b")


def exported_names() -> set[str]:
    """Every series name some Orderly process's registry exports (counters with _total, histograms
    with _bucket/_sum/_count), from the registries themselves."""
    names = {"up"}  # Prometheus's own, per target
    for kind in (metrics.IngestMetrics, metrics.WorkerMetrics, metrics.ProjectorMetrics, metrics.EffectsMetrics,
                 metrics.FetcherMetrics, metrics.AdminMetrics):
        for family in kind().registry.collect():
            names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


def alert_exprs() -> dict[str, str]:
    groups = yaml.safe_load((DOCKER / "alerts.yml").read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_exprs() -> dict[str, str]:
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "orderly.json").read_text())
    return {f"{panel['title']} {t['refId']}": t["expr"] for panel in dashboard["panels"]
            for t in panel.get("targets", [])}


def test_rules_and_dashboard_name_only_metrics_the_code_exports() -> None:
    exported = exported_names()
    assert {"orderly_effects_dead_total", "orderly_ingest_append_seconds_bucket", "process_start_time_seconds",
            "orderly_parked_oldest_seconds", "orderly_parked_overdue_resources"} <= exported
    for source, exprs in (("alerts.yml", alert_exprs()), ("orderly.json", dashboard_exprs())):
        for name, expr in exprs.items():
            named = set(METRIC.findall(expr)) | ({"up"} if re.search(r"\bup\{", expr) else set())
            assert named, f"{source} {name}: no metric found in {expr}"
            assert named <= exported, f"{source} {name} names what no process exports: {sorted(named - exported)}"
    assert len(dashboard_exprs()) == 33


def test_dockerfile_copies_every_package() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    for package in ("app", "topics", "projections"):
        assert f"COPY {package} ./{package}" in text
    assert 'ENTRYPOINT ["orderly"]' in text
