"""docker/'s monitoring, proved with a real Prometheus (Debian's package; `make prometheus`): the
alert rules pass `promtool check rules`; Prometheus runs docker/prometheus.yml's jobs and relabels
with the targets pointed at a running stack (ingest and admin as real processes next to
tests/pipeline.py's worker, projector, effects and fetcher, each on a metrics port of its own);
after a workload of signed webhooks of the three gateways every query of the Grafana dashboard
returns at least one series; the repository's alert expressions fire for what happened and for
nothing else: OrderlyQuarantineGrowing for the two stages that set records aside, OrderlyRestarted
for the one process killed and started again, and OrderlyEffectDead once the merchant stub refuses
every attempt."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from app.producer import KeyedProducer
from app.simulator import card as card_simulator
from app.simulator import lifecycles
from app.simulator import paymos as paymos_simulator
from app.simulator import pg as pg_simulator
from app.simulator.deliver import Chaos, deliver
from app.simulator.deliver import signed_headers as gateway_headers
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from tests.card_api import serve_card_api
from tests.pg_events import deposit
from tests.pipeline import PROCESSES, Running, running_pipeline
from tests.support import make_settings, signed_headers
from topics.catalog import names
from topics.records import correlation_headers

DOCKER = Path(__file__).resolve().parents[2] / "docker"
# Grafana's own variable, which Prometheus does not know: with 1 s scrapes a minute covers the run;
# the dashboard's variables at "All" (their allValue: a local stack's series have no namespace label)
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*", "$gateway": ".*"}
TIMEOUT_S = 60.0


def tool(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed: run `make prometheus` (Debian's prometheus package; make test does it)"
    return found


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every query of the dashboard, Grafana's variables replaced."""
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "orderly.json").read_text())
    panels = [p for top in dashboard["panels"] for p in (top, *top.get("panels", []))]
    found = []
    for panel in panels:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: a Grafana variable the test does not replace: {expr}"
            found.append((panel["title"], expr))
    return found


def scrape_config(ports: dict[str, int], rules: Path) -> dict[str, Any]:
    """docker/prometheus.yml with its jobs and relabels as they are, each job's DNS discovery
    replaced by the running process's 127.0.0.1 port, scraped and evaluated every second."""
    config: dict[str, Any] = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    for job in config["scrape_configs"]:
        (discovery,) = job.pop("dns_sd_configs")
        (service,) = discovery["names"]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[service]}"]}]
    assert sorted(ports) == sorted(j["job_name"].removeprefix("orderly-") for j in config["scrape_configs"])
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(rules)]
    return config


def shortened_rules(target: Path) -> None:
    """docker/alerts.yml with every rule's `for:` shortened to 1 s (the test's only change: a
    minute-long `for:` would outlast its budget; the expressions are the repository's)."""
    rules = yaml.safe_load((DOCKER / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "1s"
    target.write_text(yaml.safe_dump(rules, sort_keys=False))


@contextmanager
def running_prometheus(config: dict[str, Any], workdir: Path) -> Iterator[str]:
    port = spare_port()
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    checked = subprocess.run([tool("promtool"), "check", "config", str(workdir / "prometheus.yml")],
                             capture_output=True, text=True, timeout=30, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with (workdir / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen([tool("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def distinct_ports(names: tuple[str, ...]) -> dict[str, int]:
    """A port for each name, below the ephemeral range (``spare_port``): the servers in this process's
    threads bind ports the kernel picks inside that range, so the two never draw the same port."""
    ports: dict[str, int] = {}
    while len(ports) < len(names):
        port = spare_port()
        if port not in ports.values():
            ports[names[len(ports)]] = port
    return ports


async def until(what: str, check: Callable[[], Awaitable[Any]], deadline: float, pipe: Running) -> Any:
    """Poll ``check`` until it returns something truthy, before the monotonic ``deadline``."""
    last: Any = None
    while time.monotonic() < deadline:
        pipe.pipeline.assert_alive()
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.25)
    raise AssertionError(f"{what}: not reached in time (last: {last!r})")


async def eventually(answer: Awaitable[list[str]], wanted: list[str]) -> bool:
    return await answer == wanted


async def get_json(http: aiohttp.ClientSession, url: str, **params: str) -> Any:
    try:
        async with http.get(url, params=params) as resp:
            return await resp.json() if resp.status == 200 else None
    except aiohttp.ClientConnectionError:
        return None


async def workload(pipe: Running, ingest: str) -> None:
    """The simulator's lifecycles of the three gateways, delivered signed (with duplicates), and
    what some panels need to have happened: a 401, a quarantined body, a record the worker sets
    aside, and a card capture without its authorisation (parked, then fetched: the API answers 404)."""
    rng = random.Random(20)
    truth = lifecycles.Truth()
    events = [*pg_simulator.lifecycle(rng, 6, 2, truth), *card_simulator.lifecycle(rng, 4, truth),
              *paymos_simulator.lifecycle(rng, 1, truth)]
    async with aiohttp.ClientSession() as http:
        for dep, correlation in truth.correlations.items():
            async with http.put(f"{ingest}/correlations/pg/deposits/{dep}", data=orjson.dumps(correlation),
                                headers={"Authorization": f"Bearer {pipe.settings.api_token.reveal()}"}) as resp:
                assert resp.status == 200, await resp.text()
        stats = await deliver(ingest, events, {g: s.reveal()[0] for g, s in pipe.settings.secrets.items()}, rng,
                              Chaos(first_attempt_fails=0.0, duplicate=0.1, jitter_s=0.2))
        assert sum(stats.accepted.values()) == len(events) + sum(stats.duplicates.values()), stats
        body = deposit("dep_unsigned", 2, "pending")  # signed with a secret the ingest does not have
        async with http.post(f"{ingest}/webhooks/pg", data=body,
                             headers=gateway_headers("pg", body, "not-the-pg-secret")) as resp:
            assert resp.status == 401, await resp.text()
        for gateway, body in (("pg", deposit("dep_shape", 4, "under_review", review="a string")),
                              ("card", orjson.dumps({"id": "evt_parked", "type": "payment.captured",
                                                     "payment_ref": "pay_parked", "sequence": None,
                                                     "occurred_at": "2026-11-29T10:02:15.123Z",
                                                     "amount_minor": 5000, "currency": "EUR"}))):
            async with http.post(f"{ingest}/webhooks/{gateway}", data=body,
                                 headers=signed_headers(gateway, body, pipe.settings)) as resp:
                assert resp.status == 200, await resp.text()
    producer = KeyedProducer(pipe.settings.kafka_bootstrap)  # a correlation no stage can read, in the log
    await producer.start()
    try:
        await producer.send_and_wait(names(pipe.settings.namespace).raw, b"pg:dep_poison", b"\xff not a correlation",
                                     correlation_headers("pg", "poison-c", int(time.time() * 1000)))
    finally:
        await producer.stop()


@pytest.mark.timeout(100)  # about 3x its duration (33 s, Kafka and PostgreSQL already up)
def test_prometheus_runs_the_rules_and_every_dashboard_query_against_the_stack(
        kafka: KafkaBroker, postgres: PostgresServer, tmp_path: Path) -> None:
    checked = subprocess.run([tool("promtool"), "check", "rules", str(DOCKER / "alerts.yml")],
                             capture_output=True, text=True, timeout=30, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    queries = dashboard_queries()
    ports = distinct_ports((*PROCESSES, "ingest", "admin", "webhooks"))
    webhook_port = ports.pop("webhooks")
    settings = make_settings(kafka.bootstrap, postgres.dsn, f"prom{uuid.uuid4().hex[:8]}", effects_max_attempts=2,
                             fetch_parked_after_s=1.0, fetch_interval_s=0.5)
    with serve_card_api() as card_api, running_pipeline(
            settings.with_overrides(api_urls={"card": card_api.url}), tmp_path,
            metrics_ports={n: ports[n] for n in PROCESSES}) as pipe:
        # the ingest and the admin as processes of their own, as deployed (the pipeline's in-thread
        # ones share the test's process, whose CPU and memory are not theirs)
        pipe.pipeline.start("ingest", ORDERLY_INGEST_PORT=str(webhook_port), ORDERLY_METRICS_PORT=str(ports["ingest"]))
        pipe.pipeline.start("admin", ORDERLY_ADMIN_PORT=str(spare_port()), ORDERLY_METRICS_PORT=str(ports["admin"]))
        ingest = f"http://127.0.0.1:{webhook_port}"
        shortened_rules(tmp_path / "alerts.yml")
        with running_prometheus(scrape_config(ports, tmp_path / "alerts.yml"), tmp_path) as prometheus:
            asyncio.run(observe(pipe, ingest, prometheus, queries, ports))


async def observe(pipe: Running, ingest: str, prometheus: str, queries: list[tuple[str, str]],
                  ports: dict[str, int]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        await until("the ingest ready", lambda: get_json(http, f"{ingest}/readyz"), deadline, pipe)

        async def targets_up() -> list[str] | None:
            found = await get_json(http, f"{prometheus}/api/v1/targets")
            active = found["data"]["activeTargets"] if found else []
            up = sorted(t["labels"]["job"] for t in active if t["health"] == "up")
            return up if len(up) == len(active) == 6 else None

        jobs = await until("every target scraped", targets_up, deadline, pipe)
        assert jobs == sorted(f"orderly-{name}" for name in (*PROCESSES, "ingest", "admin"))
        pipe.stub.behave(fail_first=1)  # one failed attempt, retried and delivered: both panels' series
        await workload(pipe, ingest)
        worked = time.monotonic()

        async def empty_queries() -> list[str]:
            empty = []
            for title, expr in queries:
                found = await get_json(http, f"{prometheus}/api/v1/query", query=expr)
                assert found is not None and found["status"] == "success", (title, expr, found)
                if not found["data"]["result"]:
                    empty.append(f"{title}: {expr}")
            return empty

        async def every_query_answers() -> bool:
            return not await empty_queries()

        try:
            await until("a series for every dashboard query", every_query_answers, deadline, pipe)
        except AssertionError:
            raise AssertionError("dashboard queries without a series:\n" + "\n".join(await empty_queries())) from None
        print(f"every dashboard query answered {time.monotonic() - worked:.1f} s after the workload")
        # the relabel of docker/prometheus.yml holds: every series carries its process's service
        found = await get_json(http, f"{prometheus}/api/v1/query", query="orderly_process_info")
        assert sorted((s["metric"]["service"], s["metric"]["process"]) for s in found["data"]["result"]) \
            == sorted((name, name) for name in (*PROCESSES, "ingest", "admin"))

        async def firing_labels(name: str, label: str) -> list[str]:
            found = await get_json(http, f"{prometheus}/api/v1/alerts")
            return sorted(a["labels"][label] for a in (found["data"]["alerts"] if found else [])
                          if a["labels"]["alertname"] == name and a["state"] == "firing")

        async def alerts(name: str) -> list[str]:
            found = await get_json(http, f"{prometheus}/api/v1/alerts")
            return [a["state"] for a in (found["data"]["alerts"] if found else []) if a["labels"]["alertname"] == name]

        # what the ingest quarantined and what the worker set aside: OrderlyQuarantineGrowing, per stage
        await until("OrderlyQuarantineGrowing for the ingest and the worker",
                    lambda: eventually(firing_labels("OrderlyQuarantineGrowing", "stage"), ["ingest", "worker"]),
                    deadline, pipe)
        # a process killed and started again (as its supervisor would): OrderlyRestarted for it alone
        pipe.pipeline.kill("fetcher")
        pipe.pipeline.start("fetcher", ORDERLY_METRICS_PORT=str(ports["fetcher"]))
        killed = time.monotonic()
        await until("OrderlyRestarted for the fetcher",
                    lambda: eventually(firing_labels("OrderlyRestarted", "job"), ["orderly-fetcher"]), deadline, pipe)
        print(f"OrderlyRestarted fired {time.monotonic() - killed:.1f} s after the fetcher's kill -9")

        # the workload's effects delivered (one after a refused first attempt), none dead, no alert
        await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) > 0 AND count(*) FILTER (WHERE delivered_at IS NULL) "
                                                 "= 0 FROM effects"), timeout=max(deadline - time.monotonic(), 1))
        assert await alerts("OrderlyEffectDead") == []
        pipe.stub.behave(refuse_with=500)
        deps = [f"dep_refused{i}" for i in range(2)]
        await pipe.correlate(deps)
        async with aiohttp.ClientSession() as posting:
            for dep in deps:
                body = deposit(dep, 3, "settled")
                async with posting.post(f"{ingest}/webhooks/pg", data=body,
                                        headers=signed_headers("pg", body, pipe.settings)) as resp:
                    assert resp.status == 200, await resp.text()

        async def firing() -> list[str]:
            states = await alerts("OrderlyEffectDead")
            return states if states == ["firing"] else []

        refused = time.monotonic()
        await until("OrderlyEffectDead firing", firing, deadline, pipe)
        print(f"OrderlyEffectDead fired {time.monotonic() - refused:.1f} s after the refused settlements")
        keys = sorted(f"deposit:{dep}:{kind}" for dep in deps for kind in ("credit_user", "release_goods"))
        query = "SELECT dedupe_key, attempts FROM effects WHERE dedupe_key = ANY($1) AND dead_at IS NOT NULL " \
                "ORDER BY dedupe_key"

        async def all_dead(conn: Any) -> list[Any] | None:
            rows = await conn.fetch(query, keys)
            return rows if len(rows) == len(keys) else None

        dead = await pipe.wait_for(all_dead, timeout=10)
        # exactly the refused settlements' effects died, each after ORDERLY_EFFECTS_MAX_ATTEMPTS (2) attempts
        assert [(r["dedupe_key"], r["attempts"]) for r in dead] == [(k, 2) for k in keys]
        assert {k: pipe.stub.refused[k] for k in keys} == dict.fromkeys(keys, 2)


def test_the_alerts_that_fire_on_absence_or_on_a_new_series(tmp_path: Path) -> None:
    """`promtool test rules docker/alerts.test.yml`: a merchant down since the start (no delivered
    series at all), a target gone from discovery (no up series), a worker recreated on a new
    address (a new series, not a changed one), effects only recorded (no backlog alert), a worker
    removed by another (fires at once, quiet again 15 minutes on). The
    annotations are for people: the copy of the rules the cases run against has none, so each case
    states only when an alert fires and with which labels."""
    rules = yaml.safe_load((DOCKER / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(DOCKER / "alerts.test.yml", tmp_path / "alerts.test.yml")
    result = subprocess.run([tool("promtool"), "test", "rules", "alerts.test.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
