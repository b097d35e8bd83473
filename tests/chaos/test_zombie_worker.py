"""A zombie worker (issue #46, faults): one of two workers cut off from Kafka while it keeps running,
in both guarantees, while pg deposits flow with their truth (tests/chaos/flow.py).

The zombie reaches the broker only through toxiproxy (`make toxiproxy`): its bootstrap is the
proxy's port, and the broker advertises that port on a listener of its own (PROXIED), so the
metadata never hands it the broker's direct address. The zombie is stopped (SIGSTOP) past its
session timeout (10 s) while toxiproxy starts dropping its traffic both ways; the group gives its
partitions to the other worker. Then it runs again (SIGCONT), still believing it owns them and with
records fetched before it stopped, but cut off; then its traffic is let through again.

Afterwards: the partitions moved (the other worker was assigned them), nothing the zombie decided
after losing them landed (exactly-once: the committed decisions hold each delivery once; either
guarantee: the read models, balances and ledger equal the truth, the timeline one decision per
delivery, every effect delivered once), 0 lost."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from app.core.model import Decision
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from app.worker.exits import FAILED_EXIT_CODE
from tests.chaos.flow import Poster, converged, logged, scenario
from tests.chaos.flow import assert_matches_truth as matches_truth
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings, read_topic
from topics.catalog import names

pytestmark = pytest.mark.chaos
TOXIPROXY = Path(__file__).with_name("toxiproxy.sh")
SESSION_S = 10.0  # the worker's broker_session_timeout (app/worker/app.py)
DEPOSITS = 200
CUT_OFF_S = 5.0  # how long the zombie runs again cut off before its traffic is let through


class ProxiedBroker(KafkaBroker):
    """A broker with a second listener (PROXIED, on ``inner_port``) advertised at ``proxy_port``,
    where toxiproxy listens and forwards to it: a client bootstrapped there stays behind the proxy."""

    def __init__(self, data_dir: Path, inner_port: int, proxy_port: int) -> None:
        super().__init__(data_dir)
        self.inner_port, self.proxy_port = inner_port, proxy_port

    def _properties(self) -> str:
        text, direct = super()._properties(), f"PLAINTEXT://127.0.0.1:{self.port}"
        edits = ((f"\nlisteners={direct},", f"\nlisteners={direct},PROXIED://127.0.0.1:{self.inner_port},"),
                 (f"advertised.listeners={direct}\n", f"advertised.listeners={direct},"
                                                      f"PROXIED://127.0.0.1:{self.proxy_port}\n"),
                 ("listener.security.protocol.map=PLAINTEXT:PLAINTEXT,",
                  "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT,"))
        for old, new in edits:
            assert text.count(old) == 1, (old, text)
            text = text.replace(old, new)
        return text


class Toxiproxy:
    """toxiproxy-server on a loopback port, with one proxy ``kafka``: listen -> upstream."""

    def __init__(self, logs: Path, listen: int, upstream: int) -> None:
        found = subprocess.run(["bash", str(TOXIPROXY), "--check"], capture_output=True, text=True, check=False)
        assert found.returncode == 0, found.stderr  # make toxiproxy (make test does it)
        self.api, self.listen, self.upstream = f"http://127.0.0.1:{spare_port()}", listen, upstream
        with (logs / "toxiproxy.log").open("ab") as out:
            self.proc = subprocess.Popen([found.stdout.strip(), "-host", "127.0.0.1",
                                          "-port", self.api.rsplit(":", 1)[1]], stdout=out, stderr=subprocess.STDOUT)

    async def start(self) -> None:
        deadline = time.monotonic() + 20
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    async with http.post(f"{self.api}/proxies", json={
                            "name": "kafka", "listen": f"127.0.0.1:{self.listen}",
                            "upstream": f"127.0.0.1:{self.upstream}"}) as resp:
                        assert resp.status == 201, await resp.text()
                        return
                except aiohttp.ClientConnectionError:
                    assert time.monotonic() < deadline and self.proc.poll() is None, "toxiproxy did not start"
                    await asyncio.sleep(0.1)

    async def drop(self) -> None:
        """Every byte both ways dropped, the connections held open (the ``timeout`` toxic at 0)."""
        async with aiohttp.ClientSession() as http:
            for stream in ("upstream", "downstream"):
                async with http.post(f"{self.api}/proxies/kafka/toxics", json={
                        "name": f"drop_{stream}", "type": "timeout", "stream": stream,
                        "attributes": {"timeout": 0}}) as resp:
                    assert resp.status == 200, await resp.text()

    async def let_through(self) -> None:
        async with aiohttp.ClientSession() as http:
            for stream in ("upstream", "downstream"):
                async with http.delete(f"{self.api}/proxies/kafka/toxics/drop_{stream}") as resp:
                    assert resp.status == 204, await resp.text()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ProxiedBroker]:
    kafka = ProxiedBroker(tmp_path / "kafka", inner_port=spare_port(), proxy_port=spare_port())
    kafka.start()
    yield kafka
    kafka.stop()


@pytest.fixture
def proxy(broker: ProxiedBroker, tmp_path: Path) -> Iterator[Toxiproxy]:
    toxiproxy = Toxiproxy(tmp_path, broker.proxy_port, broker.inner_port)
    yield toxiproxy
    toxiproxy.stop()


@pytest.fixture(params=["at_least_once", "exactly_once"])
def pipe(request: pytest.FixtureRequest, broker: ProxiedBroker, postgres: PostgresServer,
         tmp_path: Path) -> Iterator[Running]:
    s = make_settings(broker.bootstrap, postgres.dsn, f"zw{uuid.uuid4().hex[:8]}",
                      processing_guarantee=request.param, worker_stall_s=20.0)
    with running_pipeline(s, tmp_path) as running:
        yield running


def remote_ports(pid: int) -> set[int]:
    """The ports process ``pid``'s established TCP connections lead to (iproute2's ss)."""
    out = subprocess.run(["ss", "-Htnp", "state", "established"], capture_output=True, text=True, check=True).stdout
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if f"pid={pid}," in line}


async def until(pipe: Running, done: object, what: str, limit_s: float = 90) -> float:
    started = time.monotonic()
    while not done():  # type: ignore[operator]
        assert time.monotonic() - started < limit_s, (what, {n: pipe.pipeline.log(n)[-2000:] for n in ("worker",
                                                                                                    "zombie")})
        await asyncio.sleep(0.2)
    return time.monotonic() - started


@pytest.mark.timeout(300)
async def test_a_worker_cut_off_while_alive_decides_nothing_that_lands(pipe: Running, proxy: Toxiproxy,
                                                                      broker: ProxiedBroker, tmp_path: Path) -> None:
    await proxy.start()
    p = pipe.pipeline

    def assigned(name: str) -> int:
        return p.log(name).count("Assigned partitions")
    await until(pipe, lambda: assigned("worker") >= 1, "the worker assigned")
    p.start("zombie", "worker", ORDERLY_KAFKA=f"127.0.0.1:{broker.proxy_port}",
            ORDERLY_DATA_DIR=str(tmp_path / "zombie"))
    await until(pipe, lambda: assigned("zombie") >= 1 and assigned("worker") >= 2, "the zombie joined")
    zombie = p.procs["zombie"]
    # it reaches the broker only through the proxy: the metadata never handed it the direct address
    remote = remote_ports(zombie.pid)
    assert broker.proxy_port in remote and broker.port not in remote, (remote, broker.port, broker.proxy_port)

    stream, truth = scenario(seed=41, deposits=DEPOSITS)
    poster = Poster(pipe, stream)
    posting = asyncio.create_task(poster.run(concurrency=8, pause_s=0.25))
    await poster.reached(0.25)
    before = assigned("worker")
    os.kill(zombie.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    await proxy.drop()
    moved_s = await until(pipe, lambda: assigned("worker") > before, "the zombie's partitions moved", 60)
    await asyncio.sleep(max(0.0, SESSION_S + 2 - (time.monotonic() - stopped_at)))
    os.kill(zombie.pid, signal.SIGCONT)
    stopped_s = time.monotonic() - stopped_at
    mark = len(p.log("zombie"))
    await asyncio.sleep(CUT_OFF_S)  # alive, cut off: whatever it decides now goes nowhere yet
    cut_alive = p.log("zombie")[mark:]
    await proxy.let_through()
    let_back = time.monotonic()
    # back (or already while cut off), it learns it lost its place and exits for its supervisor:
    # fenced (exactly-once: its transactional producer), or forgotten by its group (at-least-once:
    # it joins again as a new member)
    gone_s = await until(pipe, lambda: zombie.poll() is not None, "the zombie gone", 60)
    p.procs.pop("zombie")
    why = p.log("zombie")[mark:]
    assert zombie.returncode == FAILED_EXIT_CODE, why[-3000:]
    reasons = {"fenced": ("were fenced", "ProducerFenced", "FencedMemberError"),
               "forgotten by its group": ("again as a new member",),
               # exactly-once: the commit under way when it was stopped, past its transaction's life
               "its commit unfinished": ("did not finish within",)}
    reason = [name for name, texts in reasons.items() if any(text in why for text in texts)]
    assert reason, why[-3000:]
    await posting

    log = await logged(pipe)
    await pipe.wait_for(lambda conn: converged(conn, log), timeout=120)
    conn = await pipe.connect()
    try:
        await matches_truth(conn, truth, log)
        assert await conn.fetchval("SELECT count(*) - count(DISTINCT delivery_id) FROM webhook_events") == 0
    finally:
        await conn.close()
    expected = log.effects()

    async def all_delivered(conn: object) -> bool:
        rows = await conn.fetch("SELECT dedupe_key, delivered_at FROM effects")  # type: ignore[attr-defined]
        return ({r["dedupe_key"] for r in rows} == expected and all(r["delivered_at"] for r in rows)
                and set(pipe.stub.deliveries) == expected)
    await pipe.wait_for(all_delivered, timeout=90)
    doubled = {k: n for k, n in pipe.stub.deliveries.items() if n > 1}
    assert not doubled, doubled

    n = names(pipe.settings.namespace)
    committed = [Decision.from_bytes(r.value) for r in await read_topic(pipe.settings.kafka_bootstrap, n.decisions)]
    decided = Counter((d.delivery_id, d.outcome) for d in committed)  # a parked delivery is decided again
    twice = {k: c for k, c in decided.items() if c > 1}
    if pipe.settings.processing_guarantee == "exactly_once":
        # what the zombie decided after losing its partitions was in a transaction the broker aborted
        assert not twice, f"{len(twice)} deliveries decided twice in the committed decisions"
        effects = Counter(r.key for r in await read_topic(pipe.settings.kafka_bootstrap, n.effects))
        assert {k: c for k, c in effects.items() if c > 1} == {}, "an effect committed twice"
    print(f"\n{pipe.settings.processing_guarantee}: {len(stream)} deliveries posted "
          f"({len(poster.acked)} acknowledged, "
          f"{len(log.deliveries)} stored), lost 0; zombie stopped {stopped_s:.1f} s (partitions moved after "
          f"{moved_s:.1f} s), alive and cut off {CUT_OFF_S:.0f} s, "
          f"let back {time.monotonic() - let_back:.0f} s before the end; "
          f"committed decisions {len(committed)} ({len(twice)} deliveries twice in the topic, none twice in the "
          f"read models); effects delivered {len(pipe.stub.deliveries)}, doubled 0; zombie exited {zombie.returncode} "
          f"{gone_s:.1f} s after being let back ({reason[0]}); "
          f"its log while cut off: {len(cut_alive.splitlines())} lines")
