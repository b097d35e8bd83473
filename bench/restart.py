"""Restart to first decision: how long a worker restart pauses decisions, and where the time goes.

On the embedded stack (app/supervisor.py's Stack: one broker, PostgreSQL, the ingest, the
projector, one worker; a second worker in the same group for the takeover scenario) with a few
thousand decided, signed webhooks of the three gateways (app/simulator/lifecycles.py), for each
guarantee and each round:

- ``clean``: SIGTERM the worker, start it again at once and post a probe webhook: seconds from the
  worker's start to the probe's decision.
- ``stack``: stop the whole stack (``orderly dev``'s Ctrl-C) and start it again with its data:
  seconds from the ingest being ready to the decision of a probe posted then (the issue's figure).
- ``kill9``: ``kill -9`` of the worker, its supervisor restarting it (Stack.supervise_once): a probe
  every PROBE_EVERY_S from the kill on; seconds from the kill to the first decision.
- ``takeover``: two workers in the group, ``kill -9`` of one while probes flow to every partition;
  the longest probe's wait (the killed worker's partitions' pause) and when every probe was again
  decided within STEADY_S; its supervisor restarts it meanwhile.
- ``gone``: the same, but the killed worker is not restarted: the survivor removes it from the group
  once its alive records stopped for ORDERLY_WORKER_LOST_AFTER_MS (3 s; app/worker/peers.py), or,
  with that at 0, the group expels it at the session's end (ORDERLY_SESSION_TIMEOUT_MS, 10 s by
  default); with exactly-once the survivor then aborts its open transaction. Target: 5 s.

A probe is a new pg deposit's first webhook; it is decided when its decision is on
``<ns>.decisions`` (read_committed: with exactly-once, once its transaction committed). Each
restart's worker log (ORDERLY_FAUST_LOGLEVEL=info) is cut into phases: the interpreter's start to
the first log line (imports, the app built), the group join, the assignment, the table's
recovery, "Worker ready", the first decision. ``python -m bench restart --rounds 3
[--guarantee exactly_once] [--scenario clean]``; BENCH_KEEP=1 keeps the logs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer

from app.kafka_client import client_options
from app.settings import Settings, dev_settings
from app.simulator import card as card_simulator
from app.simulator import lifecycles
from app.simulator import paymos as paymos_simulator
from app.simulator import pg as pg_simulator
from app.simulator.deliver import signed_headers
from app.stack.process import spare_port, stop_process
from app.supervisor import Child, Stack
from bench.stack import save_results
from tests.pg_events import deposit, withdrawal
from topics.catalog import names

GUARANTEES = ("at_least_once", "exactly_once")
SCENARIOS = ("clean", "stack", "kill9", "kill9row", "takeover", "gone")
PROBE_EVERY_S = 0.05  # probes during a kill: 20 webhooks/s, each a new deposit (all partitions)
STEADY_S = 0.5  # a probe decided within this is on time again
DECIDED_LIMIT_S = 60.0  # a probe not decided in this is reported as lost (the round stays bounded)
TAKEOVER_WATCH_S = 30.0  # probes keep flowing this long after the kill of one of two workers
GONE_WATCH_S = 20.0  # the same, the killed worker not restarted (its partitions wait for its removal)
SUPERVISE_EVERY_S = 0.2  # as app/supervisor.py's supervise_until_stopped

# The worker log's milestones, in the order a start passes them (the first line of each after the start).
PHASES = {
    "first_line": re.compile(r"."),
    "tables_wait": re.compile(r"Waiting for tables to be registered"),  # Faust's TableManager sleeps 1 s
    "tables_start": re.compile(r"Table: \w+\]: Starting"),
    "partitions_assigned": re.compile(r"Executing _on_partitions_assigned"),  # the group's answer
    "rocksdb_open": re.compile(r"opening partition"),
    "assigned": re.compile(r"Assigned partitions: "),
    "highwaters": re.compile(r"Highwater for active"),
    "restoring": re.compile(r"Restoring state from changelog"),
    "aborted_tx": re.compile(r"Aborted tx until highwater"),
    "recovered": re.compile(r"Done reading from changelog|Recovery complete"),
    "ready": re.compile(r"Worker ready"),
}
# the survivor's milestones in a takeover (the last: waiting for the killed worker's open transaction)
SURVIVOR_LINES = re.compile(r"Assigned partitions|Worker ready|Aborted tx|Restoring state|open transaction")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass
class Decisions:
    """A tail of <ns>.decisions: when each delivery id's decision was first read (wall clock)."""

    settings: Settings
    seen: dict[str, float] = field(default_factory=dict)
    consumer: AIOKafkaConsumer | None = None
    task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        topic = names(self.settings.namespace).decisions
        self.consumer = AIOKafkaConsumer(topic, bootstrap_servers=self.settings.kafka_bootstrap,
                                         enable_auto_commit=False, isolation_level="read_committed",
                                         auto_offset_reset="latest", fetch_max_wait_ms=20,
                                         **client_options(self.settings))
        await self.consumer.start()  # without a group: every partition, once it knows them
        async with asyncio.timeout(10):
            while True:
                if self.consumer.assignment():
                    break
                await asyncio.sleep(0.02)
        tps = sorted(self.consumer.assignment())
        await self.consumer.seek_to_end(*tps)
        for tp in tps:  # the positions are fixed before any probe is posted
            await self.consumer.position(tp)
        self.task = asyncio.create_task(self._tail())

    async def _tail(self) -> None:
        assert self.consumer is not None
        while True:
            batches = await self.consumer.getmany(timeout_ms=50)
            now = time.time()
            for records in batches.values():
                for record in records:
                    if record.value is not None:
                        self.seen.setdefault(orjson.loads(record.value)["delivery_id"], now)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.consumer is not None:
            await self.consumer.stop()

    async def wait_for(self, delivery_ids: list[str], limit_s: float = DECIDED_LIMIT_S) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if all(d in self.seen for d in delivery_ids):
                return
            await asyncio.sleep(0.01)


@dataclass
class Probes:
    """Signed probe webhooks (each a new deposit's first event): when each was posted and its delivery id."""

    settings: Settings
    tag: str
    posted: list[tuple[float, str]] = field(default_factory=list)
    http: aiohttp.ClientSession | None = None

    async def post(self, limit_s: float = 60.0, kind: str = "deposit") -> tuple[float, str]:
        """Post one probe, retrying while the ingest is not up; (time of the accepted attempt, delivery id).
        ``kind`` "withdrawal": a new withdrawal's first event, which lands in pg_withdrawals at once
        (a deposit's first event waits for its correlation, so it makes no row)."""
        if self.http is None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        if kind == "withdrawal":
            body = withdrawal(self.withdrawal_id(len(self.posted)), 1, "filling", 0, sequence=0)
        else:
            body = deposit(f"dep_probe_{self.tag}_{len(self.posted)}", 1, "pending", sequence=0)
        headers = signed_headers("pg", body, self.settings.secrets["pg"].reveal()[0])
        deadline = time.monotonic() + limit_s
        while True:
            sent = time.time()
            try:
                async with self.http.post(f"http://{self.settings.ingest_host}:{self.settings.ingest_port}"
                                          "/webhooks/pg", data=body, headers=headers) as resp:
                    if resp.status == 200:
                        found = (sent, str((await resp.json())["delivery_id"]))
                        self.posted.append(found)
                        return found
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the ingest accepted no probe")
            await asyncio.sleep(0.02)

    def withdrawal_id(self, n: int) -> str:
        return f"wdr_probe_{self.tag}_{n}"

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()


@dataclass
class Rows:
    """When each probe withdrawal's row first shows in pg_withdrawals (wall clock): what an operator
    or the merchant sees, after the worker and the projector (polled every 10 ms)."""

    settings: Settings
    seen: dict[str, float] = field(default_factory=dict)

    async def wait_for(self, ids: list[str], limit_s: float = DECIDED_LIMIT_S, any_of: bool = False) -> None:
        deadline = time.monotonic() + limit_s
        conn: asyncpg.Connection | None = None
        try:
            while time.monotonic() < deadline:
                try:
                    if conn is None:
                        conn = await asyncpg.connect(self.settings.postgres_dsn.reveal())
                    found = await conn.fetch(f"SELECT pg_withdrawal_id FROM {self.settings.namespace}.pg_withdrawals "
                                             "WHERE pg_withdrawal_id = ANY($1)", ids)
                except (OSError, asyncpg.PostgresError):
                    conn = None  # PostgreSQL restarting with the stack: try again
                    found = []
                now = time.time()
                for row in found:
                    self.seen.setdefault(row["pg_withdrawal_id"], now)
                if (any if any_of else all)(i in self.seen for i in ids):
                    return
                await asyncio.sleep(0.01)
        finally:
            if conn is not None:
                await conn.close()


def log_size(child: Child) -> int:
    return child.log_path.stat().st_size if child.log_path.exists() else 0


def phases(child: Child, offset: int, started: float) -> dict[str, float]:
    """Seconds from ``started`` (wall clock) to each milestone of the worker's log written after ``offset``."""
    with child.log_path.open("rb") as f:
        f.seek(offset)
        lines = f.read().decode("utf-8", "replace").splitlines()
    found: dict[str, float] = {}
    for line in lines:
        stamp = STAMP.match(line)
        if stamp is None:
            continue
        at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for name, pattern in PHASES.items():
            if name not in found and pattern.search(line[stamp.end():]):
                found[name] = round(at - started, 3)
    return found


def timeline(child: Child, offset: int, started: float, until_s: float) -> list[str]:
    """The worker's log lines after ``offset`` up to ``until_s`` after ``started``, each with its
    time from ``started`` (for the notes)."""
    with child.log_path.open("rb") as f:
        f.seek(offset)
        lines = f.read().decode("utf-8", "replace").splitlines()
    out = []
    for line in lines:
        stamp = STAMP.match(line)
        if stamp is None:
            continue
        at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - started
        if at <= until_s:
            out.append(f"{at:7.3f} {line[stamp.end():][:160]}")
    return out


async def supervise(stack: Stack) -> None:
    """The supervisor's loop (app/supervisor.py), run here while a killed worker is to be restarted."""
    while True:
        stack.supervise_once()
        await asyncio.sleep(SUPERVISE_EVERY_S)


def settle(child: Child) -> None:
    """Let a worker run 10 s since its start: the supervisor counts a death sooner as a quick
    one and backs off longer before the restart."""
    delay = child.started_at + 10.5 - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def wall_start(child: Child) -> float:
    """When ``child`` was started, on the wall clock (Child keeps it on the monotonic one)."""
    return time.time() - (time.monotonic() - child.started_at)


async def clean(stack: Stack, tag: str) -> dict[str, Any]:
    worker = stack.workers[0]
    assert worker.proc is not None
    decisions, probes = Decisions(stack.settings), Probes(stack.settings, tag)
    await decisions.start()
    try:
        stopping, term = time.monotonic(), time.time()
        was_running = worker.proc.poll() is None  # False: it had died since the last scenario
        await asyncio.to_thread(stop_process, worker.proc, 30)
        stopped_s = time.monotonic() - stopping
        offset = log_size(worker)
        worker.start(stack.settings.ingest_host)
        started = wall_start(worker)
        _, probe = await probes.post()
        await decisions.wait_for([probe])
    finally:
        await probes.close()
        await decisions.stop()
    decided = decisions.seen.get(probe)
    first = round(decided - started, 3) if decided is not None else None
    return {"first_decision_s": first, "shutdown_s": round(stopped_s, 3), "was_running": was_running,
            "sigterm_to_decision_s": round(decided - term, 3) if decided is not None else None,
            "phases": {**phases(worker, offset, started), "decided": first},
            "log": timeline(worker, offset, started, (first or DECIDED_LIMIT_S) + 0.5)}


async def restart_stack(stack: Stack, tag: str) -> dict[str, Any]:
    worker = stack.workers[0]
    stopping = time.monotonic()
    await asyncio.to_thread(stack.stop)
    stopped_s = time.monotonic() - stopping
    offset = log_size(worker)
    starting = time.monotonic()
    await asyncio.to_thread(stack.start)  # returns once the ingest serves
    ready = time.time()
    started_s = time.monotonic() - starting
    worker_started = wall_start(worker)
    decisions, probes, rows = Decisions(stack.settings), Probes(stack.settings, tag), Rows(stack.settings)
    await decisions.start()
    try:
        posted, probe = await probes.post(kind="withdrawal")
        await decisions.wait_for([probe])
        await rows.wait_for([probes.withdrawal_id(0)])
    finally:
        await probes.close()
        await decisions.stop()
    decided = decisions.seen.get(probe)
    first = round(decided - ready, 3) if decided is not None else None
    row = rows.seen.get(probes.withdrawal_id(0))
    return {"first_row_s": round(row - ready, 3) if row is not None else None,
            "first_decision_s": first, "probe_accepted_s": round(posted - ready, 3),
            "stop_s": round(stopped_s, 3), "start_s": round(started_s, 3),
            "worker_start_to_ingest_ready_s": round(ready - worker_started, 3),
            "phases": {**phases(worker, offset, worker_started),
                       "decided": round(decided - worker_started, 3) if decided is not None else None},
            "log": timeline(worker, offset, worker_started, (decided or ready + DECIDED_LIMIT_S) - worker_started)}


async def probe_flow(probes: Probes, until: Callable[[], bool], limit_s: float = DECIDED_LIMIT_S) -> None:
    deadline = time.monotonic() + limit_s
    while not until() and time.monotonic() < deadline:
        await probes.post()
        await asyncio.sleep(PROBE_EVERY_S)


async def kill9(stack: Stack, tag: str) -> dict[str, Any]:
    worker = stack.workers[0]
    assert worker.proc is not None
    await asyncio.to_thread(settle, worker)
    decisions, probes = Decisions(stack.settings), Probes(stack.settings, tag)
    await decisions.start()
    supervisor = asyncio.create_task(supervise(stack))
    offset = log_size(worker)
    try:
        killed = time.time()
        os.kill(worker.proc.pid, signal.SIGKILL)
        await probe_flow(probes, lambda: any(d in decisions.seen for _, d in probes.posted))
    finally:
        supervisor.cancel()
        await asyncio.gather(supervisor, return_exceptions=True)
        await probes.close()
        await decisions.stop()
    first = min((decisions.seen[d] for _, d in probes.posted if d in decisions.seen), default=None)
    restarted = wall_start(worker)
    resumed = round(first - killed, 3) if first is not None else None
    return {"first_decision_s": resumed, "supervisor_restart_s": round(restarted - killed, 3),
            "phases": {**phases(worker, offset, restarted),
                       "decided": round(first - restarted, 3) if first is not None else None},
            "log": timeline(worker, offset, restarted, (first or killed + DECIDED_LIMIT_S) - restarted + 0.5)}


KILLED = ("ingest", "worker", "projector")  # kill9row: each in turn


async def kill9_row(stack: Stack, tag: str) -> dict[str, Any]:
    """``kill -9`` of each process in turn, its supervisor restarting it, probes (new withdrawals)
    posted from the kill on: seconds from the kill to the first probe's row in pg_withdrawals."""
    found: dict[str, Any] = {}
    for name in KILLED:
        child = stack.child(name) if name != "worker" else stack.workers[0]
        assert child.proc is not None
        await asyncio.to_thread(settle, child)
        probes, rows = Probes(stack.settings, f"{tag}{name[0]}"), Rows(stack.settings)
        supervisor = asyncio.create_task(supervise(stack))
        try:
            killed = time.time()
            os.kill(child.proc.pid, signal.SIGKILL)
            watch = asyncio.create_task(rows.wait_for([probes.withdrawal_id(n) for n in range(1200)], any_of=True))
            deadline = time.monotonic() + DECIDED_LIMIT_S
            while not watch.done() and time.monotonic() < deadline:
                await probes.post(kind="withdrawal")
                await asyncio.sleep(PROBE_EVERY_S)
            await watch
        finally:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
            await probes.close()
        first = min(rows.seen.values(), default=None)
        found[f"{name}_s"] = round(first - killed, 3) if first is not None else None
    found["worst_s"] = max((v for v in found.values() if v is not None), default=None)
    return found


async def steady(stack: Stack, tag: str, limit_s: float = 60.0) -> None:
    """Wait until 20 probes in a row are decided within STEADY_S (the group settled)."""
    decisions, probes = Decisions(stack.settings), Probes(stack.settings, tag)
    await decisions.start()
    deadline = time.monotonic() + limit_s
    try:
        in_a_row = 0
        while in_a_row < 20 and time.monotonic() < deadline:
            _, probe = await probes.post()
            await decisions.wait_for([probe], limit_s=STEADY_S)
            in_a_row = in_a_row + 1 if probe in decisions.seen else 0
    finally:
        await probes.close()
        await decisions.stop()


async def takeover(stack: Stack, second: Child, tag: str, restarted_after_kill: bool = True) -> dict[str, Any]:
    stack.children.append(second)
    second.start(stack.settings.ingest_host)
    try:
        await steady(stack, f"{tag}s")
        await asyncio.to_thread(settle, second)
        assert second.proc is not None
        decisions, probes = Decisions(stack.settings), Probes(stack.settings, tag)
        await decisions.start()
        if not restarted_after_kill:
            stack.children.remove(second)  # the supervisor leaves it down
        supervisor = asyncio.create_task(supervise(stack))
        offset, survivor = log_size(second), stack.workers[0]
        survivor_offset = log_size(survivor)
        try:
            flow = asyncio.create_task(probe_flow(probes, lambda: False))
            await asyncio.sleep(1.0)  # probes decided before the kill: the flow's normal latency
            killed = time.time()
            os.kill(second.proc.pid, signal.SIGKILL)
            watch_s = TAKEOVER_WATCH_S if restarted_after_kill else GONE_WATCH_S
            await asyncio.sleep(watch_s)
            flow.cancel()
            await asyncio.gather(flow, return_exceptions=True)
            await decisions.wait_for([d for _, d in probes.posted])
        finally:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
            await probes.close()
            await decisions.stop()
    finally:
        if second.proc is not None:
            await asyncio.to_thread(stop_process, second.proc, 30)
        second.proc = None
        if second in stack.children:
            stack.children.remove(second)
    waits = [(sent, decisions.seen.get(d)) for sent, d in probes.posted]
    after = [(sent, done) for sent, done in waits if sent >= killed]
    late = [sent for sent, done in after if done is None or done - sent > STEADY_S]
    lost = sum(1 for _, done in waits if done is None)
    on_time_again = max((done - killed for sent, done in after if sent in late and done is not None), default=0.0)
    restarted = wall_start(second) if restarted_after_kill else killed
    result = {"pause_s": round(max((done if done is not None else time.time()) - sent for sent, done in after), 3),
              "all_on_time_after_s": round(on_time_again, 3), "late_probes": len(late), "probes": len(waits),
              "lost": lost, "supervisor_restart_s": round(restarted - killed, 3),
              "before_kill_max_s": round(max((done - sent for sent, done in waits if sent < killed
                                              and done is not None), default=0.0), 3),
              "phases_restarted": phases(second, offset, restarted),
              # the surviving worker's log from the kill on: when the group gave it the killed one's partitions
              "survivor_log": [line for line in timeline(survivor, survivor_offset, killed, watch_s)
                               if SURVIVOR_LINES.search(line)]}
    await steady(stack, f"{tag}e")  # back to one worker: the next round starts settled
    return result


async def load_history(settings: Settings, seed: int = 21) -> int:
    """A few thousand signed webhooks of the three gateways and the deposits' correlations, posted
    in creation order; returns how many were accepted."""
    rng = random.Random(seed)
    truth = lifecycles.Truth()
    events = (pg_simulator.lifecycle(rng, 300, 80, truth) + card_simulator.lifecycle(rng, 300, truth)
              + paymos_simulator.lifecycle(rng, 150, truth))
    events.sort(key=lambda e: e.created_ms)
    url = f"http://{settings.ingest_host}:{settings.ingest_port}"
    accepted = 0
    async with aiohttp.ClientSession() as http:
        gate = asyncio.Semaphore(32)

        async def correlate(dep: str, body: dict[str, str]) -> None:
            async with gate, http.put(f"{url}/correlations/pg/deposits/{dep}", data=orjson.dumps(body),
                                      headers={"Authorization": f"Bearer {settings.api_token.reveal()}"}) as resp:
                assert resp.status == 200, await resp.text()

        async def post(e: lifecycles.Emitted) -> None:
            nonlocal accepted
            headers = signed_headers(e.gateway, e.body, settings.secrets[e.gateway].reveal()[0])
            async with gate, http.post(f"{url}/webhooks/{e.gateway}", data=e.body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                accepted += 1

        await asyncio.gather(*(correlate(dep, body) for dep, body in truth.correlations.items()))
        await asyncio.gather(*(post(e) for e in events))
    return accepted


async def wait_decided(settings: Settings, count: int, limit_s: float = 180.0) -> None:
    conn = await asyncpg.connect(settings.postgres_dsn.reveal(), server_settings={"search_path": settings.namespace})
    try:
        async with asyncio.timeout(limit_s):
            while True:
                if await conn.fetchval("SELECT count(*) FROM webhook_events") >= count:
                    return
                await asyncio.sleep(0.2)
    finally:
        await conn.close()


@contextmanager
def stack_for(guarantee: str, work: Path, dynamic: bool = False) -> Iterator[tuple[Stack, Child]]:
    """The embedded stack of one guarantee: (stack with one worker, a second worker of the group,
    not started). The workers are static members of their group, as ``orderly dev`` starts them
    (ORDERLY_WORKER_INSTANCE_ID); ``dynamic``: without it, for comparison."""
    env = {"ORDERLY_KAFKA": f"127.0.0.1:{spare_port()}",
           "ORDERLY_POSTGRES_DSN": f"postgresql://postgres@127.0.0.1:{spare_port()}/postgres",
           "ORDERLY_INGEST_PORT": str(spare_port()), "ORDERLY_DATA_DIR": str(work / guarantee),
           "ORDERLY_NAMESPACE": "restart", "ORDERLY_PROCESSING_GUARANTEE": guarantee,
           "ORDERLY_FAUST_LOGLEVEL": "info"}
    settings = dev_settings({**os.environ, **env})
    stack = Stack(settings, ("ingest", "worker", "projector"), workers=2)
    second = stack.child("worker-2")
    for worker in stack.workers if dynamic else []:
        worker.env.pop("ORDERLY_WORKER_INSTANCE_ID", None)
    stack.children.remove(second)  # started only for the takeover
    stack.start()
    try:
        yield stack, second
    finally:
        stack.stop()


def summary(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    lost = len(values) - len(got)
    if not got:
        return "no decision"
    text = f"median {statistics.median(got):6.2f}  worst {max(got):6.2f}  rounds {' '.join(f'{v:.2f}' for v in got)}"
    return text + (f"  ({lost} undecided)" if lost else "")


def run(rounds: int, guarantees: tuple[str, ...], scenarios: tuple[str, ...], dynamic: bool = False) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="orderly-bench-restart-"))
    results: dict[str, Any] = {}
    try:
        for guarantee in guarantees:
            with stack_for(guarantee, work, dynamic) as (stack, second):
                loaded = time.monotonic()
                accepted = asyncio.run(load_history(stack.settings))
                asyncio.run(wait_decided(stack.settings, accepted))
                print(f"{guarantee}: {accepted} webhooks decided in {time.monotonic() - loaded:.1f} s", flush=True)
                found: dict[str, list[dict[str, Any]]] = {s: [] for s in scenarios}
                for r in range(rounds):
                    for scenario in scenarios:
                        tag = f"{guarantee[0]}{r}{scenario}"
                        if scenario == "clean":
                            result = asyncio.run(clean(stack, tag))
                        elif scenario == "stack":
                            result = asyncio.run(restart_stack(stack, tag))
                        elif scenario == "kill9":
                            result = asyncio.run(kill9(stack, tag))
                        elif scenario == "kill9row":
                            result = asyncio.run(kill9_row(stack, tag))
                        elif scenario == "takeover":
                            result = asyncio.run(takeover(stack, second, tag))
                        else:
                            result = asyncio.run(takeover(stack, second, tag, restarted_after_kill=False))
                        found[scenario].append(result)
                        shown = {k: v for k, v in result.items() if k != "log"}
                        print(f"  round {r + 1} {scenario}: {shown}", flush=True)
                results[guarantee] = {"webhooks": accepted, **found}
    finally:
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"logs kept in {work}")
    return results


def report(results: dict[str, Any]) -> None:
    print(f"\nrestart benchmark: embedded stack, {os.cpu_count()} cores; seconds")
    measures = {"clean": ("first_decision_s", "worker start -> first decision (SIGTERM, start)"),
                "stack": ("first_row_s", "ingest ready -> first row in pg_withdrawals (stack restarted)"),
                "kill9row": ("worst_s", "kill -9 of ingest/worker/projector -> first row (worst of 3)"),
                "kill9": ("first_decision_s", "kill -9 -> first decision (supervisor restarts it)"),
                "takeover": ("pause_s", "two workers, kill -9 of one: longest probe wait"),
                "gone": ("pause_s", "the same, the killed one not restarted: longest wait")}
    for guarantee, found in results.items():
        print(f"{guarantee} ({found['webhooks']} webhooks decided before)")
        for scenario, (key, label) in measures.items():
            if scenario in found:
                print(f"  {label:<58} {summary([r[key] for r in found[scenario]])}")
        for r in found.get("kill9row", []):
            print(f"    kill9row per process (s from the kill to the first row): {r}")
        for r in found.get("stack", []):
            print(f"    stack: first decision {r['first_decision_s']} s, first row {r['first_row_s']} s after ready")
        for scenario in ("clean", "stack", "kill9"):
            for r in found.get(scenario, []):
                print(f"    {scenario} phases (s from the worker's start): {r['phases']}")
    print("target: <= 1.5 s after a clean restart, <= 5 s after kill -9, both guarantees")
    print(f"gone: the survivor removes the killed worker after ORDERLY_WORKER_LOST_AFTER_MS "
          f"({os.environ.get('ORDERLY_WORKER_LOST_AFTER_MS', '3000')} ms; 0: the group's session, "
          f"ORDERLY_SESSION_TIMEOUT_MS={os.environ.get('ORDERLY_SESSION_TIMEOUT_MS', '10000')}); target <= 5 s")


def command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench restart", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", "3")))
    parser.add_argument("--guarantee", choices=GUARANTEES, action="append")
    parser.add_argument("--scenario", choices=SCENARIOS, action="append")
    parser.add_argument("--dynamic", action="store_true",
                        help="for comparison: workers join without their static member id")
    args = parser.parse_args(argv)
    results = run(args.rounds, tuple(args.guarantee or GUARANTEES), tuple(args.scenario or SCENARIOS), args.dynamic)
    report(results)
    save_results("restart-dynamic" if args.dynamic else "restart", results)
    return 0


def main() -> None:
    command([])


if __name__ == "__main__":
    raise SystemExit(command(__import__("sys").argv[1:]))
