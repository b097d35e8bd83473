"""The Helm chart deploy/helm/orderly: `helm lint`, `helm template` with the default values and a
production-shaped file, every object checked against the Kubernetes 1.31 schemas (the
kubernetes-validate wheel, offline), and each process's environment held to the settings it uses
(app/setting_uses.py, the table it requires its settings by) and to what app/settings.py refuses to
start without.

helm comes from `make helm-tools` (deploy/helm/tools.sh); without it these tests fail, never skip.
The Prometheus Operator's ServiceMonitor and PrometheusRule: against the models generated from its
CRDs' schemas (the cloudcoil-models-prometheus-operator wheel, operator v0.80.1, which make helm-tools
installs off the virtualenv's path: deploy/helm/operator-models.txt says why; no field the schema
lacks), how the rules expect them (job labels), and the rules by promtool.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # the wheel ships no types
import pytest
import yaml

from app.admin.guard import PUBLIC
from app.setting_kinds import REQUIRED as SETTING_REQUIRED
from app.setting_uses import PROCESSES, USES
from app.settings import DEV_DEFAULTS, GATEWAYS, TABLE, Settings, SettingsError
from tests import served_routes
from tests.kafka_security import issue, make_ca

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "orderly"
PRODUCTION = ROOT / "deploy" / "helm" / "production-values.yaml"
KUBERNETES = "1.31.0"
ROWS = {row.env: row for row in TABLE}
REQUIRED = frozenset(row.env for row in TABLE if row.default is SETTING_REQUIRED)
# The values' default gateways: the registry's, and those a parallel branch adds (stripe, adyen),
# whose ORDERLY_SECRET_<NAME> a process reads as it reads the registry's once merged.
GATEWAY_SECRETS = frozenset(f"ORDERLY_SECRET_{g.upper()}" for g in ("pg", "card", "paymos", "stripe", "adyen"))
TLS_MOUNT = "/etc/orderly/kafka-tls/"
# Mutual TLS with an encrypted key's password on top of the production file (every secret row used).
MUTUAL_TLS = ["--set", "kafka.securityProtocol=ssl", "--set", "kafka.sasl.mechanism=null",
              "--set", "kafka.sasl.username=null", "--set", "kafka.sasl.passwordSecret=null",
              "--set", "kafka.tls.certKey=tls.crt", "--set", "kafka.tls.keyKey=tls.key",
              "--set", "kafka.tls.keyPasswordSecret.name=orderly-kafka-tls",
              "--set", "kafka.tls.keyPasswordSecret.key=key-password",
              "--set", "secrets.adyenBasicAuth.name=orderly-adyen", "--set", "secrets.adyenBasicAuth.key=basic-auth",
              "--set", "secrets.stripeApiKey.name=orderly-stripe", "--set", "secrets.stripeApiKey.key=api-key",
              "--set", "secrets.adminOidcClientSecret.name=orderly-oidc",
              "--set", "secrets.adminOidcClientSecret.key=client-secret",
              "--set-json", 'secrets.adminToken={"name": "orderly-tokens", "key": "admin-token"}']
RENDERS: dict[str, list[str]] = {
    "default": [],
    "production": ["-f", str(PRODUCTION)],
    "mutual-tls": ["-f", str(PRODUCTION), *MUTUAL_TLS],
    "two-gateways": ["-f", str(PRODUCTION), "--set", "gateways={pg,card}", "--set", "gatewaysSetting=true"],
}


@pytest.fixture(scope="module")
def tools() -> list[str]:
    """helm's path and the operator models' folder, from make helm-tools."""
    found = subprocess.run(["bash", str(ROOT / "deploy" / "helm" / "tools.sh"), "--check"],
                           capture_output=True, text=True, check=False)
    if found.returncode != 0:
        pytest.fail(f"the chart's tools are missing: {found.stderr.strip()}")
    return found.stdout.split()


@pytest.fixture(scope="module")
def helm(tools: list[str]) -> str:
    return tools[0]


@pytest.fixture(scope="module")
def operator(tools: list[str]) -> ModuleType:
    """The Prometheus Operator's v1 models, imported from their own folder."""
    if tools[1] not in sys.path:
        sys.path.append(tools[1])
    return importlib.import_module("cloudcoil.models.prometheus_operator.v1")


def template(helm: str, *args: str) -> list[dict[str, Any]]:
    result = subprocess.run([helm, "template", "orderly", str(CHART), "--namespace", "payments",
                             "--kube-version", KUBERNETES, *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(helm: str) -> dict[str, list[dict[str, Any]]]:
    started = time.perf_counter()
    renders = {name: template(helm, *args) for name, args in RENDERS.items()}
    print(f"helm template, {len(renders)} renders: {time.perf_counter() - started:.2f} s")
    return renders


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        spec = obj.get("spec", {}).get("template", {}).get("spec")
        if spec:
            for container in spec["containers"]:
                yield container["name"], container


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


@pytest.mark.parametrize("values", [[], ["-f", str(PRODUCTION)]], ids=["default", "production"])
def test_helm_lint_passes_strict(helm: str, values: list[str]) -> None:
    result = subprocess.run([helm, "lint", "--strict", str(CHART), *values], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


# The chart's oldest Kubernetes (Chart.yaml's kubeVersion) and the newest the wheel knows.
@pytest.mark.parametrize("version", [KUBERNETES, kubernetes_validate.latest_version()])
@pytest.mark.parametrize("name", list(RENDERS))
def test_every_object_is_valid_kubernetes(rendered: dict[str, list[dict[str, Any]]], name: str, version: str) -> None:
    started = time.perf_counter()
    checked = 0
    for obj in rendered[name]:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD's: test_monitoring_objects_match_the_operators_crds
        kubernetes_validate.validate(obj, version, strict=True)  # raises on any schema error
        checked += 1
    print(f"{name}: {checked} objects validated against {version} in {time.perf_counter() - started:.2f} s")
    kinds = {obj["kind"] for obj in rendered[name]}
    assert {"Deployment", "StatefulSet", "Service", "Job"} <= kinds and checked >= 12


def test_a_schema_error_is_caught() -> None:
    """The validation can fail: a Deployment's replicas as text is refused."""
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replicas": "three", "selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c"}]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)


def test_each_process_runs_in_its_own_workload(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["production"]
    workloads = {obj["metadata"]["name"].removeprefix("orderly-"): obj["kind"]
                 for obj in objects if obj["kind"] in ("Deployment", "StatefulSet", "Job")}
    assert workloads == {"ingest": "Deployment", "worker": "StatefulSet", "projector": "Deployment",
                         "effects": "Deployment", "fetcher": "Deployment", "admin": "Deployment",
                         "migrate": "Job"}
    for name, container in containers(objects):
        assert container["args"] == [name]
    services = {obj["metadata"]["name"].removeprefix("orderly-"): obj for obj in of_kind(objects, "Service")}
    assert {p["name"] for p in services["ingest"]["spec"]["ports"]} == {"http", "metrics"}
    assert services["worker"]["spec"]["clusterIP"] == "None"


def test_the_workers_have_a_stable_id_and_a_volume_each(rendered: dict[str, list[dict[str, Any]]]) -> None:
    (workers,) = of_kind(rendered["production"], "StatefulSet")
    assert workers["spec"]["replicas"] == 3
    (claim,) = workers["spec"]["volumeClaimTemplates"]
    (container,) = workers["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ORDERLY_WORKER_INSTANCE_ID"] is not None and "{hostname}" in env["ORDERLY_WORKER_INSTANCE_ID"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == env["ORDERLY_DATA_DIR"]


def test_what_is_required_only_with_another_setting_comes_with_it(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The admin refuses to start with neither an OpenID Connect issuer nor the break-glass token
    (with an issuer, its client's secret comes too); effects delivered are signed; each pod of a
    disruption budget's process is one of two or more."""
    for render, objects in rendered.items():
        env = {name: env_of(c) for name, c in containers(objects)}
        assert "ORDERLY_ADMIN_TOKEN" in env["admin"] or "ORDERLY_ADMIN_OIDC_ISSUER" in env["admin"], render
        assert ("ORDERLY_ADMIN_OIDC_ISSUER" in env["admin"]) is ("ORDERLY_ADMIN_OIDC_CLIENT_SECRET" in env["admin"])
        assert ("ORDERLY_EFFECTS_URL" in env["effects"]) is ("ORDERLY_EFFECTS_SECRET" in env["effects"]), render
    budgets = {o["metadata"]["name"]: o["spec"]["maxUnavailable"] for o in of_kind(rendered["production"],
                                                                                   "PodDisruptionBudget")}
    assert budgets == {"orderly-ingest": 1, "orderly-worker": 1}


def test_more_workers_than_partitions_is_refused(helm: str) -> None:
    result = subprocess.run([helm, "template", "o", str(CHART), "--set", "worker.replicas=13"],
                            capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "more than kafka.partitions (12)" in result.stderr


PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def probe_problems(process: str, container: dict[str, Any]) -> list[str]:
    """Why a container's probes are wrong ([] when right): a probe at a port the container does not
    name, or at a path the process does not serve there (tests/served_routes.py, read from the code);
    on the admin's port a path its guard does not leave public; no readiness probe on the /readyz
    the process serves; or one on anything else."""
    serves = served_routes.served(process)
    problems = []
    for kind in PROBES:
        if kind not in container:
            continue
        target = container[kind]["httpGet"]
        path, port = target["path"], target["port"]
        there = sorted(serves.get(port, []))
        if path not in there:
            problems.append(f"{process}: {kind} at {path} on port {port!r}, which serves {there}")
        elif port == "admin" and path not in PUBLIC:
            problems.append(f"{process}: {kind} at {path}, which answers 401 to a probe (not public)")
    ready = container.get("readinessProbe", {}).get("httpGet", {})
    readyz = [port for port, paths in serves.items() if "/readyz" in paths]
    if readyz and (ready.get("path"), ready.get("port")) not in [("/readyz", port) for port in readyz]:
        problems.append(f"{process}: readinessProbe {ready or None}, not the /readyz it serves on {readyz}")
    return problems


def test_probes_ask_what_each_process_serves(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for render, objects in rendered.items():
        for name, container in containers(objects):
            if name != "migrate":
                assert probe_problems(name, container) == [], render
                assert "livenessProbe" in container, name
    probes = {name: (c["livenessProbe"]["httpGet"]["path"], c.get("readinessProbe", {}).get("httpGet", {}).get("path"))
              for name, c in containers(rendered["production"]) if name != "migrate"}
    assert probes == {"ingest": ("/healthz", "/readyz"), "admin": ("/healthz", "/readyz"), "worker": ("/metrics", None),
                      "projector": ("/metrics", "/readyz"), "effects": ("/metrics", "/readyz"),
                      "fetcher": ("/metrics", "/readyz")}


def test_a_probe_at_a_path_or_port_not_served_is_caught(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The check can fail: /healthz on the effects' metrics port, /readyz on the worker's (Faust serves
    /metrics only), the admin's /readyz asked on its metrics port, the projector's readiness on /metrics."""
    found = {name: c for name, c in containers(rendered["production"])}
    effects, worker, admin, projector = (yaml.safe_load(yaml.safe_dump(found[n]))
                                         for n in ("effects", "worker", "admin", "projector"))
    effects["livenessProbe"]["httpGet"]["path"] = "/healthz"
    assert probe_problems("effects", effects) == [
        "effects: livenessProbe at /healthz on port 'metrics', which serves ['/metrics', '/readyz']"]
    worker["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": "metrics"}}
    assert probe_problems("worker", worker) == [
        "worker: readinessProbe at /readyz on port 'metrics', which serves ['/metrics']"]
    admin["readinessProbe"]["httpGet"]["port"] = "metrics"
    assert probe_problems("admin", admin)[0] == (
        "admin: readinessProbe at /readyz on port 'metrics', which serves ['/metrics']")
    admin["readinessProbe"]["httpGet"] = {"path": "/api/overview", "port": "admin"}
    assert "not public" in probe_problems("admin", admin)[0]
    projector["readinessProbe"]["httpGet"]["path"] = "/metrics"
    assert probe_problems("projector", projector) == [
        "projector: readinessProbe {'path': '/metrics', 'port': 'metrics'}, not the /readyz it serves on ['metrics']"]


def test_metrics_ports(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, container in containers(rendered["production"]):
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        env = {e["name"]: e.get("value") for e in container["env"]}
        if "ORDERLY_METRICS_PORT" in env:
            assert ports["metrics"] == int(env["ORDERLY_METRICS_PORT"]) and env["ORDERLY_METRICS_HOST"] == "0.0.0.0"
        else:
            assert name == "migrate"  # every long-running process, the admin too, serves /metrics apart


def operator_problem(operator: ModuleType, obj: dict[str, Any]) -> str | None:
    """Why a Prometheus Operator object does not fit its CRD's schema (None when it does): a value of
    the wrong type or form, or a field the schema does not have (dropped by the model's round trip)."""
    try:
        model = getattr(operator, obj["kind"]).model_validate(obj)
    except ValueError as exc:
        return str(exc)
    kept = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return None if kept == obj else f"fields the {obj['kind']} CRD does not have: {obj} became {kept}"


def test_monitoring_objects_match_the_operators_crds(rendered: dict[str, list[dict[str, Any]]],
                                                    operator: ModuleType, tmp_path: Path) -> None:
    objects = rendered["production"]
    assert not [o for o in rendered["default"] if o["apiVersion"].startswith("monitoring.coreos.com/")]
    (monitor,) = of_kind(objects, "ServiceMonitor")
    (rule,) = of_kind(objects, "PrometheusRule")
    for obj in (monitor, rule):
        assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["metadata"]["labels"]["release"]
        assert operator_problem(operator, obj) is None
    spec = monitor["spec"]
    for service in of_kind(objects, "Service"):  # each selected, its job orderly-<process> as the rules expect
        labels = service["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items()
        assert labels[spec["jobLabel"]] == "orderly-" + labels["app.kubernetes.io/component"]
        assert {p["name"] for p in service["spec"]["ports"]} & {e["port"] for e in spec["endpoints"]}
    docker = yaml.safe_load((ROOT / "docker" / "alerts.yml").read_text(encoding="utf-8"))
    assert rule["spec"] == {"groups": docker["groups"]}
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: make prometheus"
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}), encoding="utf-8")
    checked = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_an_operator_object_off_its_crd_is_caught(rendered: dict[str, list[dict[str, Any]]],
                                                  operator: ModuleType) -> None:
    (monitor,) = of_kind(rendered["production"], "ServiceMonitor")
    (rule,) = of_kind(rendered["production"], "PrometheusRule")
    typo = yaml.safe_load(yaml.safe_dump(monitor))
    typo["spec"]["endpoints"][0]["intervall"] = "15s"
    assert "fields the ServiceMonitor CRD does not have" in (operator_problem(operator, typo) or "")
    duration = yaml.safe_load(yaml.safe_dump(rule))
    duration["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    assert "String should match pattern" in (operator_problem(operator, duration) or "")


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), f"{container['name']}: a variable set twice"
    return {e["name"]: e for e in container["env"]}


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real PEM files under the key names the values use (ca.crt, tls.crt, tls.key), for from_env."""
    pki = issue(make_ca(tmp_path_factory.mktemp("pki")), "client")
    folder = tmp_path_factory.mktemp("kafka-tls")
    for name, source in (("ca.crt", pki.ca), ("tls.crt", pki.cert("client")), ("tls.key", pki.key("client"))):
        (folder / name).write_bytes(source.read_bytes())
    return folder


SAMPLE_SECRETS = {"ORDERLY_ADYEN_BASIC_AUTH": "adyen-user:a-secret-value"}  # secrets with a form of their own


def resolved(env: dict[str, dict[str, Any]], tls: Path) -> dict[str, str]:
    """What the process would see: a Secret's value a valid sample, the TLS mount our files."""
    values = {}
    for name, entry in env.items():
        if "valueFrom" in entry:
            values[name] = DEV_DEFAULTS.get(name, SAMPLE_SECRETS.get(name, "a-secret-value"))
        else:
            values[name] = entry["value"].replace(TLS_MOUNT, f"{tls}/")
    return values


def uses(process: str, gateways: frozenset[str]) -> frozenset[str]:
    """The variables ``process`` uses (app/setting_uses.py), with the enabled gateways' secrets."""
    fields = USES[process]
    return frozenset(row.env for row in TABLE if row.field in fields and row.field != "secrets") | (
        gateways if "secrets" in fields else frozenset())


def settings_problems(process: str, env: dict[str, dict[str, Any]], tls: Path) -> list[str]:
    """Why a container's environment is not exactly what ``process`` needs ([] when it is): a
    variable that is no setting, a setting the process does not use, a required one missing, or an
    environment app/settings.py refuses (read as the process reads it, nothing filled in)."""
    problems = []
    if unknown := set(env) - set(ROWS) - GATEWAY_SECRETS:
        problems.append(f"{process}: {sorted(unknown)} are no settings of Orderly's")
    enabled = env["ORDERLY_GATEWAYS"]["value"].split(",") if "ORDERLY_GATEWAYS" in env else GATEWAYS
    used = uses(process, frozenset(f"ORDERLY_SECRET_{g.upper()}" for g in enabled))
    if unused := set(env) - used:
        problems.append(f"{process} is given {sorted(unused)}, which it does not use")
    if missing := (REQUIRED | GATEWAY_SECRETS) & used - set(env):
        problems.append(f"{process} lacks {sorted(missing)}")
    try:
        Settings.from_env(resolved(env, tls), USES[process])
    except SettingsError as exc:
        problems.append(f"{process}: {exc}")
    return problems


@pytest.mark.parametrize("render", list(RENDERS))
@pytest.mark.parametrize("process", PROCESSES)
def test_each_process_gets_exactly_the_settings_it_reads(rendered: dict[str, list[dict[str, Any]]], tls_files: Path,
                                                        render: str, process: str) -> None:
    (container,) = [c for name, c in containers(rendered[render]) if name == process]
    assert settings_problems(process, env_of(container), tls_files) == []


def test_a_setting_too_many_or_too_few_is_caught(helm: str, tls_files: Path) -> None:
    """The check can fail: a setting the process never reads, one it needs taken away, a value refused."""
    objects = template(helm, "--set", "worker.env.ORDERLY_ADMIN_PORT=9000", "--set", "projector.env.ORDERLY_NOPE=1",
                       "--set", "fetcher.env.ORDERLY_FETCH_RATE_PER_S=fast")
    found = {name: settings_problems(name, env_of(c), tls_files) for name, c in containers(objects)}
    assert found["worker"] == ["worker is given ['ORDERLY_ADMIN_PORT'], which it does not use"]
    assert found["projector"][0] == "projector: ['ORDERLY_NOPE'] are no settings of Orderly's"
    assert "ORDERLY_FETCH_RATE_PER_S" in found["fetcher"][0]
    assert found["ingest"] == found["admin"] == []
    (ingest,) = [c for name, c in containers(objects) if name == "ingest"]
    env = env_of(ingest)
    del env["ORDERLY_SECRET_PAYMOS"]
    lacking = settings_problems("ingest", env, tls_files)
    assert lacking[0] == "ingest lacks ['ORDERLY_SECRET_PAYMOS']" and "ORDERLY_SECRET_PAYMOS is not set" in lacking[1]


@pytest.mark.parametrize("render", list(RENDERS))
def test_every_secret_comes_from_a_secret(rendered: dict[str, list[dict[str, Any]]], render: str) -> None:
    secret_rows = {row.env for row in TABLE if row.is_secret}
    for process, container in containers(rendered[render]):
        for name, entry in env_of(container).items():
            is_secret = name in secret_rows or name.startswith("ORDERLY_SECRET_")
            assert ("valueFrom" in entry) is is_secret, f"{process}: {name}"
            if is_secret:
                assert set(entry["valueFrom"]) == {"secretKeyRef"}
    if render == "mutual-tls":  # production plus the key password: every secret of settings.py is wired
        given = {name for _, c in containers(rendered[render]) for name in env_of(c)}
        assert secret_rows - given == {"ORDERLY_KAFKA_SASL_PASSWORD"}  # SASL is off with mutual TLS
        assert secret_rows <= given | {n for _, c in containers(rendered["production"]) for n in env_of(c)}


def test_a_secret_reference_only_for_the_enabled_gateways(helm: str) -> None:
    assert set(GATEWAYS) <= set(yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))["gateways"])
    objects = template(helm, "--set", "gateways={pg,card}")
    for process, container in containers(objects):
        named = {n for n in env_of(container) if n.startswith("ORDERLY_SECRET_")}
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"] if e["name"] in named}
        assert refs == ({"ORDERLY_SECRET_PG": "pg", "ORDERLY_SECRET_CARD": "card"} if process == "ingest" else {})
    per_process = template(helm, "--set", "gateways={stripe}", "--set", "gatewaysSetting=true")
    for process, container in containers(per_process):
        env = env_of(container)
        assert ("ORDERLY_SECRET_STRIPE" in env) is (process == "ingest")
        if "gateways" in USES[process]:
            assert env["ORDERLY_GATEWAYS"]["value"] == "stripe"
        else:
            assert "ORDERLY_GATEWAYS" not in env, process


@pytest.mark.parametrize(("value", "refusal"), [
    ("kafka.bootstrapp=x", "additional properties 'bootstrapp' not allowed"),
    ("kafka.securityProtocol=tls", "value must be one of"),
    ("worker.env.WORKER_BATCH=5", "does not match pattern"),
    ("gateways={pg,Card}", "does not match pattern"),
])
def test_the_values_schema_refuses_a_typo(helm: str, value: str, refusal: str) -> None:
    result = subprocess.run([helm, "template", "o", str(CHART), "--set", value], capture_output=True, text=True,
                            check=False)
    assert result.returncode != 0 and refusal in result.stderr
