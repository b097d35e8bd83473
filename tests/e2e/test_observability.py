"""Observability inside the processes (issue #20 item 4), on the real pipeline with JSON logs and
exactly-once (so the worker's outputs carry transaction markers): every process's /metrics on a
port of its own, with its own CPU, memory and start time and its name; consumer lag per group and
topic; parked deliveries per gateway; quarantine records per stage; 401 and quarantine reasons in
the ingest's log, sampled; every log line JSON, Faust's included, and no secret in any of them."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app import logs
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from tests.card_api import CardApi, serve_card_api
from tests.pipeline import PROCESSES, Running, running_pipeline
from tests.support import make_settings, signed_headers
from topics.catalog import names

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
FETCH_REQUESTS = 25  # operator fetches appended at once; at 5 a second the fetcher takes 5 s over them


@dataclass
class Observed:
    pipe: Running
    urls: dict[str, str]  # process -> its /metrics
    started_at: float  # wall clock before any process started
    card_api: CardApi


@pytest.fixture(scope="module")
def obs(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"obs{uuid.uuid4().hex[:8]}", processing_guarantee="exactly_once",
                      log_format="json", fetch_rate_per_s=5.0)
    ports = {name: spare_port() for name in (*PROCESSES, "ingest")}
    started_at = time.time()
    with serve_card_api() as api, running_pipeline(s.with_overrides(api_urls={"card": api.url}),
                                                    tmp_path_factory.mktemp("observability"),
                                                    metrics_ports=ports) as running:
        yield Observed(running, {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()},
                       started_at, api)


async def scrape(url: str, timeout: float = 30.0) -> Samples:
    """Every sample of ``url``, once it answers: (name, labels) -> value."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url) as resp:
                    assert resp.status == 200
                    text = await resp.text()
                    break
            except aiohttp.ClientConnectionError:
                assert time.monotonic() < deadline, f"{url} does not answer"
                await asyncio.sleep(0.2)
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def until(url: str, name: str, expected: float, timeout: float = 30.0, **labels: str) -> list[float | None]:
    """Scrape ``url`` until ``name{labels}`` is ``expected``; every value seen on the way."""
    deadline, seen = time.monotonic() + timeout, []
    while True:
        seen.append(value(await scrape(url), name, **labels))
        if seen[-1] == expected:
            return seen
        assert time.monotonic() < deadline, f"{name}{labels} never {expected} at {url}: {seen[-10:]}"
        await asyncio.sleep(0.25)


def card_event(ref: str, eid: str, kind: str, second: int, amount: int) -> bytes:
    return orjson.dumps({"id": eid, "type": f"payment.{kind}", "payment_ref": ref, "sequence": None,
                         "occurred_at": f"2026-11-29T10:02:{15 + second:02d}.123Z", "amount_minor": amount,
                         "currency": "EUR"})


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a process's log, each of which must be one JSON object with the four fields."""
    found: list[dict[str, Any]] = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        record = orjson.loads(line)  # a line that is not JSON fails here
        assert {"timestamp", "level", "logger", "message"} <= set(record), line
        found.append(record)
    return found


async def test_every_process_serves_its_own_resources_and_name(obs: Observed) -> None:
    pids = {name: proc.pid for name, proc in obs.pipe.pipeline.procs.items()}
    for name, url in obs.urls.items():
        samples = await scrape(url)
        assert value(samples, "orderly_process_info", process=name, version=version()) == 1.0, name
        assert [k for k in samples if k[0] == "orderly_process_info"] == [
            ("orderly_process_info", frozenset({("process", name), ("version", version())}))]
        assert (value(samples, "process_resident_memory_bytes") or 0) > 10_000_000, name
        assert value(samples, "process_cpu_seconds_total") is not None, name
        start = value(samples, "process_start_time_seconds") or 0
        if name == "ingest":  # served in the test's own process, which started before the pipeline
            assert start < obs.started_at
        else:  # the process's own start, not its parent's
            assert obs.started_at - 1 <= start <= time.time(), name
            assert start == pytest.approx(proc_start(pids[name]), abs=0.02)


def version() -> str:
    from app.metrics import _installed

    return _installed()


def proc_start(pid: int) -> float:
    """A process's start time (wall clock) from /proc, as the ProcessCollector computes it."""
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
    with open(f"/proc/{pid}/stat") as f:
        start_ticks = float(f.read().rsplit(")", 1)[1].split()[19])
    return boot + start_ticks / ticks


async def test_a_parked_card_event_is_counted_until_its_predecessor_arrives_and_lag_returns_to_0(
        obs: Observed) -> None:
    pipe, projector = obs.pipe, obs.urls["projector"]
    ref = f"pay_obs_{uuid.uuid4().hex[:6]}"
    # the card document: a capture before its authorisation waits (parked) for it
    await pipe.post("card", card_event(ref, f"evt_{ref}_c", "captured", 1, 5000))
    seen = await until(projector, "orderly_parked_events", 1.0, gateway="card")
    samples = await scrape(projector)
    assert value(samples, "orderly_parked_resources", gateway="card") == 1.0
    assert 0 < (value(samples, "orderly_parked_oldest_seconds", gateway="card") or 0) < 60
    assert [value(samples, "orderly_parked_events", gateway=g) for g in ("pg", "paymos")] == [0.0, 0.0]
    assert set(seen) <= {None, 0.0, 1.0}

    await pipe.post("card", card_event(ref, f"evt_{ref}_a", "authorised", 0, 5000))
    await until(projector, "orderly_parked_events", 0.0, gateway="card")
    samples = await scrape(projector)
    assert (value(samples, "orderly_parked_resources", gateway="card"),
            value(samples, "orderly_parked_oldest_seconds", gateway="card")) == (0.0, 0.0)

    # once the scenario is consumed every group's lag is 0, past the exactly-once commit markers too
    n, ns = names(pipe.settings.namespace), pipe.settings.namespace
    for process, group, topic in (("worker", f"{ns}-worker", n.raw), ("projector", "projector", n.decisions),
                                  ("projector", "quarantine", n.quarantine), ("effects", "effects", n.effects),
                                  ("fetcher", f"{ns}-fetcher", n.fetch)):
        await until(obs.urls[process], "orderly_consumer_lag", 0.0, group=group, topic=topic)
    # and the admin's figure of the same groups (orderly_consumer_lag there too) agrees
    deadline = time.monotonic() + 20
    while True:
        status, overview = await pipe.admin_get("/api/overview")
        lags = {(g["group"], g["topic"]): g["lag"] for g in overview["consumer_lag"]}
        if status == 200 and lags and not any(lags.values()):
            break
        assert time.monotonic() < deadline, f"the admin's consumer lag is not 0: {lags}"
        await asyncio.sleep(0.5)
    # the capture's one effect (mark_order_paid) delivered: nothing pending, nothing dead
    effects = obs.urls["effects"]
    await until(effects, "orderly_effects_delivered_total", 1.0, type="mark_order_paid")
    await until(effects, "orderly_effects_pending", 0.0)
    samples = await scrape(effects)
    assert (value(samples, "orderly_effects_oldest_pending_seconds"), value(samples, "orderly_effects_dead_records"),
            value(samples, "orderly_effects_dead_total")) == (0.0, 0.0, 0.0)
    assert pipe.stub.deliveries[f"card:{ref}:mark_order_paid"] == 1


async def test_the_fetchers_lag_counts_requests_waiting_then_returns_to_0(obs: Observed) -> None:
    pipe, fetcher = obs.pipe, obs.urls["fetcher"]
    group, topic = f"{pipe.settings.namespace}-fetcher", names(pipe.settings.namespace).fetch
    await until(fetcher, "orderly_consumer_lag", 0.0, group=group, topic=topic)
    # A fetcher at 2 requests a second takes 12 s over them, so its readings (every 5 s) cannot all
    # miss the wait: at the module's 5 a second it sometimes finished between two (seen in CI).
    pipe.pipeline.terminate("fetcher")
    pipe.pipeline.start("fetcher", ORDERLY_METRICS_PORT=fetcher.rsplit(":", 1)[1].split("/")[0],
                        ORDERLY_FETCH_RATE_PER_S="2")
    refs = [f"pay_lag_{uuid.uuid4().hex[:6]}_{i}" for i in range(FETCH_REQUESTS)]
    from app.producer import KeyedProducer

    producer = KeyedProducer(pipe.settings.kafka_bootstrap)
    await producer.start()
    try:
        for ref in refs:
            await producer.send_and_wait(topic, f"card:{ref}".encode(),
                                         orjson.dumps({"gateway": "card", "kind": "payment", "payment_ref": ref}))
    finally:
        await producer.stop()
    deadline, waiting = time.monotonic() + 30, 0.0
    while not waiting:
        waiting = value(await scrape(fetcher), "orderly_consumer_lag", group=group, topic=topic) or 0.0
        assert time.monotonic() < deadline, "the fetcher's lag never counted the waiting requests"
        await asyncio.sleep(0.2)
    assert 0 < waiting <= FETCH_REQUESTS
    await until(fetcher, "orderly_consumer_lag", 0.0, timeout=60, group=group, topic=topic)
    assert all(obs.card_api.calls[ref] == 1 for ref in refs)  # each request carried out once (404: no payment)


async def test_401_and_quarantine_reasons_are_logged_once_each_as_json_and_sampled_under_a_flood(
        obs: Observed) -> None:
    pipe = obs.pipe
    port, metrics_port = spare_port(), spare_port()
    pipe.pipeline.start("ingest-json", command="ingest", ORDERLY_INGEST_PORT=str(port),
                        ORDERLY_METRICS_PORT=str(metrics_port))
    url, metrics = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
    log_path = pipe.pipeline.logs / "ingest-json.log"
    body = card_event("pay_refused", "evt_refused", "captured", 1, 100)
    forged = {**signed_headers("card", body, pipe.settings), "webhook-signature": "v1,Zm9yZ2VkIHNpZ25hdHVyZQ=="}
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 30
        while True:
            try:
                async with http.get(f"{url}/readyz") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()[-2000:]
            await asyncio.sleep(0.2)
        async with http.get(f"{url}/metrics") as resp:  # the webhook port serves no metrics (DESIGN.md §3)
            assert resp.status == 404

        async def post(data: bytes, headers: dict[str, str]) -> tuple[int, Any]:
            async with http.post(f"{url}/webhooks/card", data=data, headers=headers) as resp:
                return resp.status, await resp.json()

        assert (await post(body, forged))[0] == 401
        await until(metrics, "orderly_ingest_signature_failures_total", 1.0, gateway="card")
        refused = [r for r in json_lines(log_path) if r["message"].startswith("401 ")]
        assert [(r["level"], r["logger"], r["gateway"], r["reason"], r["message"]) for r in refused] == [
            ("WARNING", "orderly.ingest", "card", "no webhook-signature v1 matches",
             "401 card: no webhook-signature v1 matches")]

        for _ in range(30):  # a flood: the first five lines a minute per gateway and reason are written
            assert (await post(body, forged))[0] == 401
        await until(metrics, "orderly_log_lines_suppressed_total", 26.0, logger="orderly.ingest")
        assert len([r for r in json_lines(log_path) if r["message"].startswith("401 ")]) == 5

        # a validly signed body of a type the card document does not list: quarantined, its reason logged
        strange = card_event("pay_strange", "evt_strange", "teleported", 1, 100)
        status, answer = await post(strange, signed_headers("card", strange, pipe.settings))
        assert (status, answer["quarantined"]) == (200, True)
    await until(metrics, "orderly_ingest_quarantined_total", 1.0, gateway="card", reason="unknown_type")
    quarantined = [r for r in json_lines(log_path) if r["message"].startswith("quarantined ")]
    assert [(r["gateway"], r["delivery_id"], r["resource_id"], r["code"], r["event_id"]) for r in quarantined] == [
        ("card", answer["delivery_id"], "pay_strange", "unknown_type", "evt_strange")]
    assert "teleported" in quarantined[0]["reason"]
    await until(obs.urls["projector"], "orderly_quarantine_records", 1.0, stage="ingest")

    # every process's every line is JSON, Faust's own included; no secret in any of them, no body
    worker = json_lines(pipe.pipeline.logs / "worker.log")
    assert any(r["logger"].startswith("faust") for r in worker)
    secrets = [s for s in logs.secrets_of(pipe.settings) if s and len(s) >= 6]
    for name in (*PROCESSES, "ingest-json"):
        text = (pipe.pipeline.logs / f"{name}.log").read_text(errors="replace")
        json_lines(pipe.pipeline.logs / f"{name}.log")
        assert not [s for s in secrets if s in text], name
        assert "Zm9yZ2VkIHNpZ25hdHVyZQ" not in text and '"amount_minor"' not in text, name
    pipe.pipeline.terminate("ingest-json")
