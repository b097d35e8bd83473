"""A running Orderly pipeline for end-to-end tests: worker, projector and effects worker as real
processes, the ingest served in a thread, and a stub merchant endpoint counting effect deliveries."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
from aiohttp import web

from app.bootstrap import prepare
from app.settings import Settings
from projections.migrate import quote_ident
from tests.support import ServedIngest, serve_in_thread, serve_ingest, signed_headers

PROCESSES = ("worker", "projector", "effects", "fetcher")


@dataclass
class EffectsStub:
    """The merchant's effects endpoint: counts every delivery per Idempotency-Key."""

    url: str = ""
    deliveries: Counter[str] = field(default_factory=Counter)
    fail_first: int = 0  # answer 503 to the first N requests (retry path)
    seen: int = 0
    first_at: dict[str, float] = field(default_factory=dict)  # monotonic time of each key's first POST


@contextmanager
def effects_stub(fail_first: int = 0) -> Iterator[EffectsStub]:
    stub = EffectsStub(fail_first=fail_first)

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        stub.seen += 1
        if stub.seen <= stub.fail_first:
            return web.Response(status=503)
        key = request.headers["Idempotency-Key"]
        stub.deliveries[key] += 1
        stub.first_at.setdefault(key, time.monotonic())
        return web.Response(status=204)

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
        """Start ``orderly <command or name>`` as the process called ``name`` (extra env on top)."""
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
        fails the test, so that no process outlives it."""
        proc = self.procs.pop(name)
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{name} did not stop within {timeout_s:.0f} s of SIGTERM") from None

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
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

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.settings.postgres_dsn,
                                     server_settings={"search_path": quote_ident(self.settings.namespace)})

    async def post(self, gateway: str, *bodies: bytes) -> list[dict[str, Any]]:
        """Deliver signed webhooks one after another; each must be acknowledged with 200."""
        answers = []
        async with aiohttp.ClientSession() as http:
            for body in bodies:
                async with http.post(f"{self.ingest.url}/webhooks/{gateway}", data=body,
                                     headers=signed_headers(gateway, body, self.settings)) as resp:
                    assert resp.status == 200, await resp.text()
                    answers.append(await resp.json())
        return answers

    async def canary(self, dep: str, timeout: float = 30.0) -> float:
        """A pg deposit's correlation and settlement through the ingest; seconds until its read-model
        row says settled (the pipeline still decides and projects)."""
        from tests.pg_events import deposit

        started = time.monotonic()
        async with aiohttp.ClientSession() as http, http.put(
                f"{self.ingest.url}/correlations/pg/deposits/{dep}", data=orjson.dumps(
                    {"merchant_reference": f"mr_{dep}", "our_order_id": f"o_{dep}", "our_user_id": f"u_{dep}"}),
                headers={"Authorization": f"Bearer {self.settings.api_token}"}) as resp:
            assert resp.status == 200, await resp.text()
        await self.post("pg", deposit(dep, 3, "settled"))
        await self.wait_for(lambda c: c.fetchval(
            "SELECT status = 'settled' FROM pg_deposits WHERE pg_deposit_id = $1", dep), timeout=timeout)
        return time.monotonic() - started

    async def wait_for(self, check: Callable[[asyncpg.Connection], Awaitable[Any]], timeout: float = 60.0) -> Any:
        """Poll PostgreSQL until ``check`` returns something truthy."""
        conn = await self.connect()
        try:
            deadline = time.monotonic() + timeout
            last: Any = None
            while time.monotonic() < deadline:
                self.pipeline.restart_stalled()  # as its supervisor would
                self.pipeline.assert_alive()
                last = await check(conn)
                if last:
                    return last
                await asyncio.sleep(0.2)
            raise AssertionError(f"not reached in {timeout}s (last: {last!r})\n"
                                 + self.pipeline.log("worker")[-3000:] + self.pipeline.log("projector")[-2000:])
        finally:
            await conn.close()


@contextmanager
def running_pipeline(settings: Settings, logs: Path, stub_fail_first: int = 0) -> Iterator[Running]:
    with ExitStack() as stack:
        stub = stack.enter_context(effects_stub(stub_fail_first))
        settings = settings.with_overrides(effects_url=stub.url, data_dir=logs)
        asyncio.run(prepare(settings))
        pipeline = Pipeline(settings, logs)
        for name in PROCESSES:
            pipeline.start(name)
        stack.callback(pipeline.stop)
        ingest = stack.enter_context(serve_ingest(settings))
        yield Running(settings, pipeline, ingest, stub)
