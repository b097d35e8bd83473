"""`orderly dev`: the whole embedded stack starts, answers, stops on SIGTERM, and comes back with
its data after a restart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson

from app.settings import dev_settings
from app.stack.process import port_is_free, spare_port
from app.supervisor import PROCESSES
from tests.support import admin_token, read_topic, signed_headers
from topics.catalog import names


def start_dev(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "app.cli", "dev"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_for_stack(data_dir: Path, proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        stack = data_dir / "stack.json"
        if stack.exists():
            return dict(json.loads(stack.read_text()))
        time.sleep(0.2)
    raise AssertionError("orderly dev did not come up:\n" + log.read_text()[-3000:])


async def eventually_get(http: aiohttp.ClientSession, url: str, within_s: float = 60) -> str:
    deadline = time.monotonic() + within_s
    while True:
        try:
            async with http.get(url) as resp:
                return await resp.text()
        except aiohttp.ClientConnectionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def distinct_spare_ports(count: int) -> list[int]:
    """``count`` different spare ports (Kafka's, PostgreSQL's, the admin's)."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(spare_port())
    return sorted(ports)


def ingest_port_apart(others: list[int]) -> int:
    """A spare port for the ingest whose next two (its /metrics, the worker's) are free, and none of
    whose processes' /metrics ports (the ingest's + 1, + 2, …: app/supervisor.py) is one of ``others``
    (an admin port there: two binds of one port)."""
    while True:
        port = spare_port(span=3)
        if not set(range(port, port + len(PROCESSES) + 1)) & set(others):
            return port


def stop_dev(proc: subprocess.Popen[bytes]) -> int:
    os.kill(proc.pid, signal.SIGTERM)
    return proc.wait(90)


async def test_dev_stack_lifecycle(tmp_path: Path) -> None:
    data_dir = tmp_path / ".orderly"
    # below the ephemeral range (spare_port): the stack is started again on the same ports, and an
    # outgoing connection of another test may take a port of that range while it is down
    kafka_port, pg_port, admin_port = others = distinct_spare_ports(3)
    ingest_port = ingest_port_apart(others)
    env = {**os.environ, "ORDERLY_DATA_DIR": str(data_dir), "ORDERLY_KAFKA": f"127.0.0.1:{kafka_port}",
           "ORDERLY_POSTGRES_DSN": f"postgresql://postgres@127.0.0.1:{pg_port}/postgres",
           "ORDERLY_INGEST_PORT": str(ingest_port), "ORDERLY_ADMIN_PORT": str(admin_port),
           "ORDERLY_PARTITIONS": "2"}
    settings = dev_settings(env)
    log = tmp_path / "dev.log"

    # The worker's usual /metrics port (ingest + 2; the ingest's own is ingest + 1) is taken, as the
    # local end of an outgoing connection can take it: the supervisor must serve it elsewhere, not
    # restart the worker forever.
    squatter = socket.socket()
    for _ in range(100):  # an ingest port two below a free one, so that the test can take it, with
        try:                # the one between free too (the ingest's /metrics; else served elsewhere)
            if not port_is_free(ingest_port + 1):
                raise OSError("the ingest's metrics port is taken")
            squatter.bind(("127.0.0.1", ingest_port + 2))
            break
        except OSError:
            ingest_port = ingest_port_apart(others)
    squatter.listen()
    env["ORDERLY_INGEST_PORT"] = str(ingest_port)
    settings = dev_settings(env)
    proc = start_dev(env, log)
    try:
        stack = await asyncio.to_thread(wait_for_stack, data_dir, proc, log)
        # this stack's own credentials, random, in a file only its user may read
        assert stat.S_IMODE((data_dir / "stack.json").stat().st_mode) == 0o600
        made = stack.pop("credentials")
        assert made["ORDERLY_ADMIN_TOKEN"] in log.read_text()  # printed
        assert "dev-admin-token" not in made.values() and made["ORDERLY_API_TOKEN"] != "dev-api-token"
        settings = dev_settings({**env, **made})
        process_metrics: dict[str, str] = stack.pop("process_metrics_urls")
        processes: dict[str, dict[str, int]] = stack.pop("processes")
        brokers, workers = stack.pop("brokers"), stack.pop("workers")
        assert stack.pop("controllers") == []  # one node is its own controller
        postgres = stack.pop("postgres")
        assert postgres["port"] == pg_port
        os.kill(postgres["pid"], 0)
        assert stack == {"namespace": "orderly",
                         "ingest_url": f"http://127.0.0.1:{ingest_port}",
                         "admin_url": f"http://127.0.0.1:{admin_port}",
                         "postgres_dsn": settings.postgres_dsn.reveal(),
                         "kafka_bootstrap": settings.kafka_bootstrap,
                         "replication_factor": 1, "min_insync_replicas": 1,
                         "metrics_url": f"http://127.0.0.1:{ingest_port + 1}/metrics"}
        assert sorted(process_metrics) == ["admin", "effects", "fetcher", "ingest", "projector", "worker"]
        assert sorted(processes) == ["admin", "effects", "fetcher", "ingest", "projector", "worker"]
        assert processes["ingest"]["port"] == ingest_port and processes["admin"]["port"] == admin_port
        assert processes["admin"]["metrics_port"] not in (None, admin_port)  # a bind of its own, like every process
        for name, url in process_metrics.items():
            assert url == f"http://127.0.0.1:{processes[name]['metrics_port']}/metrics"
        assert [(b["node_id"], b["port"]) for b in brokers] == [(1, kafka_port)]
        assert workers == [{"name": "worker", "pid": processes["worker"]["pid"],
                            "metrics_port": processes["worker"]["metrics_port"]}]
        for described in [*brokers, *workers]:
            os.kill(described["pid"], 0)
        for described in processes.values():  # every pid named is a live process of this stack
            os.kill(described["pid"], 0)
        body = orjson.dumps({"id": "evt_1", "object": "event", "type": "deposit.pending", "sequence": 1,
                             "created": "2026-11-29T10:33:15Z",
                             "data": {"object": {"id": "dep_dev", "object": "deposit", "version": 1,
                                                 "status": "pending", "ordered_amount_minor": 500_000}}})
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{stack['ingest_url']}/webhooks/pg", data=body,
                                 headers=signed_headers("pg", body, settings)) as resp:
                assert resp.status == 200
            async with http.put(f"{stack['ingest_url']}/correlations/pg/deposits/dep_dev",
                                data=orjson.dumps({"merchant_reference": "m", "our_order_id": "o",
                                                   "our_user_id": "u"}),
                                headers={"Authorization": f"Bearer {settings.api_token.reveal()}"}) as resp:
                assert resp.status == 200
            async with http.get(stack["metrics_url"]) as resp:
                assert "orderly_ingest_requests_total" in await resp.text()
            assert process_metrics["worker"] != f"http://127.0.0.1:{ingest_port + 2}/metrics"
            async with http.get(f"{stack['ingest_url']}/metrics") as resp:  # never on the webhook port
                assert resp.status == 404
            assert "orderly_worker_partitions" in await eventually_get(http, process_metrics["worker"])
            # the admin serves behind its token on its own port; the webhook port serves no resource data
            async with http.get(f"{stack['admin_url']}/api/overview") as resp:
                assert resp.status == 401
            async with http.get(f"{stack['admin_url']}/metrics", allow_redirects=False) as resp:
                # not on the admin port: without a credential a page there sends to sign-in
                assert resp.status == 303 and resp.headers["Location"] == "/login?next=%2Fmetrics"
            assert "orderly_admin_requests_total" in await eventually_get(http, process_metrics["admin"])
            async with http.get(f"{stack['admin_url']}/api/overview",
                                headers={"Authorization": f"Bearer {admin_token(settings)}"}) as resp:
                assert resp.status == 200 and "parked" in await resp.json()
            async with http.get(f"{stack['ingest_url']}/resources/pg/dep_dev") as resp:
                assert resp.status == 404
        # kill -USR1 of `orderly dev`: each of its processes logs where its tasks wait, and goes on
        # (sent again every 2 s: a process still starting ignores it until it can log its tasks)
        sizes = {name: (data_dir / f"{name}.log").stat().st_size for name in processes}
        deadline, sent = time.monotonic() + 40, 0.0
        while missing := [name for name, size in sizes.items()
                          if b"orderly.process: task " not in (data_dir / f"{name}.log").read_bytes()[size:]]:
            assert time.monotonic() < deadline, f"no tasks logged after SIGUSR1 by {missing}"
            if time.monotonic() - sent > 2.0:
                os.kill(proc.pid, signal.SIGUSR1)
                sent = time.monotonic()
            await asyncio.sleep(0.2)
        for described in processes.values():
            os.kill(described["pid"], 0)
        assert "worker exited" not in log.read_text(), log.read_text()[-3000:]
        assert await asyncio.to_thread(stop_dev, proc) == 0
        for port in (kafka_port, pg_port, ingest_port):
            assert port_is_free(port), f"port {port} still held after SIGTERM"

        # same data dir: the log and the tables come back; this time serving pg alone (ORDERLY_GATEWAYS),
        # started without the other gateways' secrets
        proc = start_dev({**env, "ORDERLY_GATEWAYS": "pg", "ORDERLY_SECRET_CARD": "", "ORDERLY_SECRET_PAYMOS": ""},
                         log)
        stack = await asyncio.to_thread(wait_for_stack, data_dir, proc, log)
        again = stack.pop("credentials")  # the next stack on the same data: credentials of its own
        assert again["ORDERLY_ADMIN_TOKEN"] != made["ORDERLY_ADMIN_TOKEN"]
        assert again["ORDERLY_API_TOKEN"] != made["ORDERLY_API_TOKEN"]
        assert sorted(again) == ["ORDERLY_ADMIN_TOKEN", "ORDERLY_API_TOKEN", "ORDERLY_EFFECTS_SECRET",
                                 "ORDERLY_SECRET_PG"]  # the gateways served only
        assert stat.S_IMODE((data_dir / "stack.json").stat().st_mode) == 0o600
        settings = dev_settings({**env, **again})
        async with aiohttp.ClientSession() as http:
            await eventually_get(http, f"{stack['ingest_url']}/healthz")
            for gateway in ("card", "paymos"):
                async with http.post(f"{stack['ingest_url']}/webhooks/{gateway}", data=b"{}") as resp:
                    assert resp.status == 404, gateway
            async with http.put(f"{stack['ingest_url']}/correlations/pg/deposits/dep_dev",
                                data=orjson.dumps({"merchant_reference": "m", "our_order_id": "o",
                                                   "our_user_id": "u"}),
                                headers={"Authorization": f"Bearer {settings.api_token.reveal()}"}) as resp:
                assert resp.status == 200  # pg's other route is served: the same mapping again
        records = await read_topic(settings.kafka_bootstrap, names("orderly").raw)
        assert [r.value for r in records if r.headers.get("record") != "correlation"] == [body]
        assert [orjson.loads(r.value)["pg_deposit_id"] for r in records if r.headers.get("record") == "correlation"] \
            == ["dep_dev", "dep_dev"]  # the deposit's correlation is a record of its log too (PUT twice)
        conn = await asyncpg.connect(settings.postgres_dsn.reveal())
        try:
            row = await conn.fetchrow("SELECT * FROM orderly.pg_deposit_correlations")
            assert row is not None and dict(row) == {"pg_deposit_id": "dep_dev", "merchant_reference": "m",
                                 "our_order_id": "o", "our_user_id": "u"}
        finally:
            await conn.close()
    finally:
        squatter.close()
        if proc.poll() is None:
            stop_dev(proc)
