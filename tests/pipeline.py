"""A running Orderly pipeline for end-to-end tests: worker, projector and effects worker as real
processes, the ingest served in a thread, and a stub merchant endpoint verifying and counting effect
deliveries."""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from app.admin.app import create_app as create_admin
from app.bootstrap import prepare
from app.settings import Settings
from app.stack.process import spare_port
from projections.migrate import quote_ident
from tests.openapi_check import checked, delivery_errors
from tests.support import ServedIngest, admin_token, read_topic, serve_in_thread, serve_ingest, signed_headers
from topics.catalog import names

PROCESSES = ("worker", "projector", "effects", "fetcher")


@dataclass
class EffectsStub:
    """The merchant's effects endpoint: verifies every delivery's Standard Webhooks signature with the
    settings' secret (``standardwebhooks``, an implementation independent of Orderly's) and its body
    and headers against the OpenAPI document's ``webhooks`` entry (tests/openapi_check.py), counts the
    accepted deliveries per Idempotency-Key, and can be told to fail, refuse or answer slowly."""

    url: str = ""
    secret: str = ""
    deliveries: Counter[str] = field(default_factory=Counter)  # 2xx answers per key
    requests: Counter[str] = field(default_factory=Counter)  # validly signed requests per key, any answer
    refused: Counter[str] = field(default_factory=Counter)  # validly signed requests answered non-2xx, per key
    rejected: list[str] = field(default_factory=list)  # why each badly signed or off-document request got 400
    fail_first: int = 0  # answer 503 to the first N validly signed requests (retry path)
    refuse_with: int | None = None  # answer every validly signed request with this status
    hold_s: float = 0.0  # keep each validly signed request open this long before answering
    seen: int = 0
    concurrent: int = 0
    max_concurrent: int = 0  # the most validly signed requests open at once
    first_at: dict[str, float] = field(default_factory=dict)  # monotonic time of each key's first 2xx
    # called (in the stub's thread) with each validly signed request's key once it is counted in
    # ``requests``; True: the connection is dropped with no answer at all (e.g. after the hook has
    # killed the effects worker that sent it: a merchant that did the work, a sender that never heard)
    on_request: Callable[[str], bool] | None = None

    def behave(self, fail_first: int = 0, refuse_with: int | None = None, hold_s: float = 0.0) -> None:
        """From now on: fail the next ``fail_first`` requests, refuse all, or hold each open."""
        self.seen, self.max_concurrent = 0, self.concurrent
        self.fail_first, self.refuse_with, self.hold_s = fail_first, refuse_with, hold_s

    def verify(self, body: bytes, headers: Mapping[str, str]) -> str | None:
        """Why the delivery is refused as badly signed or off the OpenAPI document, or None."""
        try:
            Webhook(self.secret).verify(body, dict(headers), json_parse=False)
        except (WebhookVerificationError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        if headers.get("Idempotency-Key") != headers.get("webhook-id"):
            return f"Idempotency-Key {headers.get('Idempotency-Key')!r} is not webhook-id {headers.get('webhook-id')!r}"
        if off := delivery_errors(body, headers):
            return f"off the OpenAPI document's webhooks.effect: {off}"
        return None


@contextmanager
def effects_stub(secret: str, fail_first: int = 0) -> Iterator[EffectsStub]:
    stub = EffectsStub(secret=secret, fail_first=fail_first)

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        if (why := stub.verify(body, request.headers)) is not None:
            stub.rejected.append(f"{request.headers.get('webhook-id')}: {why}")
            return web.Response(status=400, text=why)
        key = request.headers["webhook-id"]
        stub.requests[key] += 1
        if stub.on_request is not None and stub.on_request(key):
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=204)  # never written: the connection is closed
        stub.seen += 1
        stub.concurrent += 1
        stub.max_concurrent = max(stub.max_concurrent, stub.concurrent)
        try:
            if stub.hold_s:
                await asyncio.sleep(stub.hold_s)
            status = 503 if stub.seen <= stub.fail_first else stub.refuse_with or 204
        finally:
            stub.concurrent -= 1
        if not 200 <= status < 300:
            stub.refused[key] += 1
            return web.Response(status=status)
        stub.deliveries[key] += 1
        stub.first_at.setdefault(key, time.monotonic())
        return web.Response(status=status)

    app = web.Application()
    app.router.add_post("/effects", handle)
    with serve_in_thread(app) as url:
        stub.url = f"{url}/effects"
        yield stub


class Pipeline:
    def __init__(self, settings: Settings, logs: Path) -> None:
        self.settings = settings
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {**os.environ, **settings.to_env(), "ORDERLY_FAUST_LOGLEVEL": "info", "ORDERLY_DEBUG_SINKS": "1"}

    def start(self, name: str, command: str | None = None, **env: str) -> None:
        """Start ``orderly <command or name>`` as the process called ``name`` (extra env on top). A
        worker is a static member of its group under its name, as ``orderly dev`` starts it."""
        if (command or name) == "worker":
            env = {"ORDERLY_WORKER_INSTANCE_ID": name, **env}
        with (self.logs / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen([sys.executable, "-m", "app.cli", command or name],
                                                env={**self.env, **env}, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:  # it may have exited on its own (and been started again by restart_stalled)
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def terminate(self, name: str, timeout_s: float = 30) -> None:
        """Stop ``name`` gracefully (SIGTERM); one still running after ``timeout_s`` is killed and
        fails the test, so that no process outlives it, with where its tasks waited (SIGUSR1:
        app/process_setup.dump_tasks) in the failure."""
        proc = self.procs.pop(name)
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} did not stop within {timeout_s:.0f} s of SIGTERM; its tasks:\n"
                                 f"{self._tasks_then_kill(name, proc)}") from None

    def _tasks_then_kill(self, name: str, proc: subprocess.Popen[bytes]) -> str:
        """Where the tasks of ``name`` wait (SIGUSR1: app/process_setup.dump_tasks, from its log),
        then SIGKILL."""
        log = self.logs / f"{name}.log"
        before = log.stat().st_size
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(1.0)
        proc.kill()
        proc.wait()
        with log.open("rb") as f:
            f.seek(before)
            return f.read().decode(errors="replace")[-6000:]

    def stop(self) -> None:
        """SIGTERM every process; one still running 20 s later is killed, and where its tasks waited
        is printed on the real stderr (outside pytest's capture): a stop that hangs is a bug worth
        seeing even where the test does not fail for it."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                print(f"\ntests/pipeline.py: {name} did not stop within 20 s of SIGTERM and was killed; its "
                      f"tasks:\n{self._tasks_then_kill(name, proc)}", file=sys.__stderr__)
        self.procs.clear()

    def restart_stalled(self) -> list[str]:
        """Start again every process that exited because it found itself stalled (exit code 3, see
        app/liveness.py) or found records skipped (exit code 5, app.worker.exits.OffsetGuard), as its
        supervisor would; returns their names."""
        from app.worker.exits import SKIPPED_EXIT_CODE, STALLED_EXIT_CODE

        restarted = [name for name, proc in self.procs.items()
                     if proc.poll() in (STALLED_EXIT_CODE, SKIPPED_EXIT_CODE)]
        for name in restarted:
            self.start(name)
        return restarted

    def assert_alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"{name} died:\n" + (self.logs / f"{name}.log").read_text()[-4000:]

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")


@dataclass
class Running:
    settings: Settings
    pipeline: Pipeline
    ingest: ServedIngest
    stub: EffectsStub
    admin: str  # the admin API's URL (app/admin), served in a thread like the ingest

    async def admin_get(self, path: str) -> tuple[int, Any]:
        """GET an admin API path with the admin token: (status, JSON body), the answer checked
        against the OpenAPI document."""
        async with aiohttp.ClientSession(middlewares=(checked(self.admin),)) as http, http.get(
                f"{self.admin}{path}", headers={"Authorization": f"Bearer {admin_token(self.settings)}"}) as resp:
            return resp.status, await resp.json()

    async def resource(self, gateway: str, resource_id: str) -> tuple[int, Any]:
        from urllib.parse import quote

        return await self.admin_get(f"/api/resources/{gateway}/{quote(resource_id, safe='')}")

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.settings.postgres_dsn.reveal(),
                                     server_settings={"search_path": quote_ident(self.settings.namespace)})

    async def post(self, gateway: str, *bodies: bytes) -> list[dict[str, Any]]:
        """Deliver signed webhooks one after another; each must be acknowledged with 200 (the answer
        checked against the OpenAPI document)."""
        answers = []
        async with aiohttp.ClientSession(middlewares=(checked(self.ingest.url, "ingest"),)) as http:
            for body in bodies:
                async with http.post(f"{self.ingest.url}/webhooks/{gateway}", data=body,
                                     headers=signed_headers(gateway, body, self.settings)) as resp:
                    assert resp.status == 200, await resp.text()
                    answers.append(await resp.json())
        return answers

    async def correlate(self, deps: list[str]) -> None:
        """Register each pg deposit's merchant mapping (order ``o_<dep>``, user ``u_<dep>``) and wait
        until the worker has them all, so the deposits that follow are not parked a while."""
        async with aiohttp.ClientSession(middlewares=(checked(self.ingest.url, "ingest"),)) as http:
            for dep in deps:
                async with http.put(f"{self.ingest.url}/correlations/pg/deposits/{dep}", data=orjson.dumps(
                        {"merchant_reference": f"mr_{dep}", "our_order_id": f"o_{dep}", "our_user_id": f"u_{dep}"}),
                        headers={"Authorization": f"Bearer {self.settings.api_token.reveal()}"}) as resp:
                    assert resp.status == 200, await resp.text()
        await self.wait_for(lambda c: c.fetchval(
            "SELECT count(*) = $2 FROM webhook_events WHERE resource_id = ANY($1) "
            "AND event_type = 'correlation.registered'", deps, len(deps)))

    async def canary(self, dep: str, timeout: float = 30.0) -> float:
        """A pg deposit's correlation and settlement through the ingest; seconds until its read-model
        row says settled (the pipeline still decides and projects)."""
        from tests.pg_events import deposit

        started = time.monotonic()
        async with aiohttp.ClientSession() as http, http.put(
                f"{self.ingest.url}/correlations/pg/deposits/{dep}", data=orjson.dumps(
                    {"merchant_reference": f"mr_{dep}", "our_order_id": f"o_{dep}", "our_user_id": f"u_{dep}"}),
                headers={"Authorization": f"Bearer {self.settings.api_token.reveal()}"}) as resp:
            assert resp.status == 200, await resp.text()
        await self.post("pg", deposit(dep, 3, "settled"))
        await self.wait_for(lambda c: c.fetchval(
            "SELECT status = 'settled' FROM pg_deposits WHERE pg_deposit_id = $1", dep), timeout=timeout)
        return time.monotonic() - started

    async def effects_settled(self, timeout: float = 90.0) -> int:
        """Until every effect on orderly.effects is recorded and delivered (or dead): none is on its way
        when a replay starts, to pass for one the replay delivered. The deliveries the merchant had."""
        emitted = {r.key.decode() for r in await read_topic(self.settings.kafka_bootstrap,
                                                             names(self.settings.namespace).effects) if r.key}
        await self.wait_for(lambda c: c.fetchval(
            "SELECT count(*) = $1 FROM effects WHERE dedupe_key = ANY($2::text[]) "
            "AND (delivered_at IS NOT NULL OR dead_at IS NOT NULL)", len(emitted), list(emitted)), timeout=timeout)
        return sum(self.stub.deliveries.values())

    async def wait_for(self, check: Callable[[asyncpg.Connection], Awaitable[Any]], timeout: float = 60.0,
                       until: Callable[[Any], bool] = bool) -> Any:
        """Poll PostgreSQL until ``until`` holds of what ``check`` returns (by default: until it is truthy).
        A list of rows that grows while projections catch up needs its own ``until`` (its full length)."""
        conn = await self.connect()
        try:
            deadline = time.monotonic() + timeout
            last: Any = None
            while time.monotonic() < deadline:
                self.pipeline.restart_stalled()  # as its supervisor would
                self.pipeline.assert_alive()
                last = await check(conn)
                if until(last):
                    return last
                await asyncio.sleep(0.2)
            raise AssertionError(f"not reached in {timeout}s (last: {last!r})\n"
                                 + self.pipeline.log("worker")[-3000:] + self.pipeline.log("projector")[-2000:])
        finally:
            await conn.close()


@contextmanager
def running_pipeline(settings: Settings, logs: Path, stub_fail_first: int = 0,
                     metrics_ports: Mapping[str, int] | None = None) -> Iterator[Running]:
    """``metrics_ports``: the ORDERLY_METRICS_PORT of each process named (others serve none; the in-thread
    ingest serves its /metrics on a free port unless "ingest" is named: Running.ingest.metrics_url)."""
    with ExitStack() as stack:
        assert settings.effects_secret, "the effects stub verifies signatures: ORDERLY_EFFECTS_SECRET is needed"
        stub = stack.enter_context(effects_stub(settings.effects_secret.reveal(), stub_fail_first))
        settings = settings.with_overrides(effects_url=stub.url, data_dir=logs)
        asyncio.run(prepare(settings))
        pipeline = Pipeline(settings, logs)
        for name in PROCESSES:
            port = (metrics_ports or {}).get(name)
            pipeline.start(name, **({"ORDERLY_METRICS_PORT": str(port)} if port else {}))
        stack.callback(pipeline.stop)
        ingest = stack.enter_context(serve_ingest(settings, (metrics_ports or {}).get("ingest", 0)))
        admin = stack.enter_context(serve_in_thread(create_admin(settings)))
        asyncio.run(ingest_ready(ingest.url))
        yield Running(settings, pipeline, ingest, stub, admin)
        assert not stub.rejected, f"badly signed or off-document effect deliveries: {stub.rejected[:5]}"


async def ingest_ready(url: str, timeout: float = 60.0) -> None:
    """Until the ingest's /readyz says Kafka and PostgreSQL both answer, as a load balancer waits
    before it sends traffic: the first requests of a test then do not race the ingest's producer and
    pool being set up while the stack's processes start (a correlation PUT answered 503 once in CI)."""
    deadline = time.monotonic() + timeout
    said = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        while True:
            try:
                async with http.get(f"{url}/readyz") as resp:
                    body = await resp.text()
                    if resp.status == 200 and orjson.loads(body).get("postgres") is True:
                        return
                    said = f"{resp.status} {body}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                said = repr(exc)
            assert time.monotonic() < deadline, f"the ingest was not ready in {timeout} s: {said}"
            await asyncio.sleep(0.1)


LIBFAKETIME = "/usr/lib/*/faketime/libfaketime.so.1"  # Debian's libfaketime (make test installs it)


@dataclass
class PastIngest:
    """`orderly ingest` as a process of its own whose wall clock runs ``seconds_behind`` behind
    (libfaketime; its monotonic clock stays real): what it receives is stamped as received that long
    ago, which is how a test meets a limit of 60 s or 4 days without waiting it out."""

    name: str
    url: str
    seconds_behind: int

    async def post(self, gateway: str, settings: Settings, *bodies: bytes) -> None:
        async with aiohttp.ClientSession() as http:
            for body in bodies:  # signed at the time the ingest believes it is (it refuses |now - t| > 300 s)
                headers = signed_headers(gateway, body, settings, now=time.time() - self.seconds_behind)
                async with http.post(f"{self.url}/webhooks/{gateway}", data=body, headers=headers) as resp:
                    assert resp.status == 200, await resp.text()


async def start_past_ingest(pipe: Running, seconds_behind: int) -> PastIngest:
    found = glob.glob(LIBFAKETIME)
    assert found, f"libfaketime is not installed ({LIBFAKETIME}): `make faketime` (make test does it)"
    name, port = f"ingest-{seconds_behind}s", spare_port()
    pipe.pipeline.start(name, command="ingest", ORDERLY_INGEST_PORT=str(port), LD_PRELOAD=found[0],
                        FAKETIME=f"-{seconds_behind}", FAKETIME_DONT_FAKE_MONOTONIC="1")
    ingest = PastIngest(name, f"http://127.0.0.1:{port}", seconds_behind)
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as http:
        while True:
            pipe.pipeline.assert_alive()
            try:
                async with http.get(f"{ingest.url}/readyz") as resp:
                    if resp.status == 200:
                        return ingest
            except aiohttp.ClientConnectionError:
                pass
            assert time.monotonic() < deadline, pipe.pipeline.log(name)[-3000:]
            await asyncio.sleep(0.2)
