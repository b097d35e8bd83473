"""Real infrastructure for the tests: one Apache Kafka broker, one PostgreSQL server and (for the
console's sign-in) one Keycloak per session, each started when a test first needs it.

Kafka and PostgreSQL are started by the project's own helpers, Keycloak by tests/keycloak.py.
Nothing here skips: a server that cannot start is a test failure, in CI as anywhere else.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import hypothesis  # noqa: F401  (before any test: on CPython 3.11.7 a later first import, from its terminal-summary hook, failed with SystemError: AST constructor recursion depth)
import pytest

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from projections.migrate import connect, migrate
from tests import parsing
from tests.keycloak import Keycloak

parsing.install()  # CPython 3.11.7's race between parses (tests/parsing.py), for every parse of the process

TEMP_ROOT = Path("/tmp")
KEEP_TEMPS = 3


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """As root, each run's temporary files go to a directory of its own, /tmp/orderly-pytest-<pid>,
    not pytest's shared /tmp/pytest-of-root: PostgreSQL runs as an unprivileged user there
    (app/stack/postgres.py opens its path's parents to it), and any other pytest run starting
    meanwhile (``make test-unit`` beside ``make test``) sets that shared directory back to 0700,
    after which PostgreSQL can no longer reach its data and aborts. The three newest of the ended
    runs' directories are kept, like pytest's own."""
    if config.option.basetemp is not None or os.geteuid() != 0:
        return
    ended = sorted((p for p in TEMP_ROOT.glob("orderly-pytest-*") if not _alive(p.name.rsplit("-", 1)[1])),
                   key=lambda p: p.stat().st_mtime)
    for old in ended[:-KEEP_TEMPS]:
        shutil.rmtree(old, ignore_errors=True)
    config.option.basetemp = str(TEMP_ROOT / f"orderly-pytest-{os.getpid()}")


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


NOTABLE = re.compile(r"WARNING|ERROR|CRITICAL|Traceback|exit", re.IGNORECASE)


def notable_lines(log: Path, keep: int = 12) -> list[str]:
    """The last warnings and errors of a process log, and its last two lines."""
    lines = log.read_text(errors="replace").splitlines()
    notable = [line[:300] for line in lines if NOTABLE.search(line)][-keep:]
    return notable + [f"(last) {line[:300]}" for line in lines[-2:]]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, pytest.TestReport,
                                                                                         pytest.TestReport]:
    """A failed test that ran processes (their logs in its tmp_path, as tests/pipeline.py writes them)
    reports what each one warned of last, first in its report: a time-out shows where it stood."""
    report = yield
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    logs = sorted(tmp.glob("*.log")) if report.failed and isinstance(tmp, Path) and tmp.is_dir() else []
    if logs:
        text = "\n".join(f"--- {log.name}\n" + "\n".join(notable_lines(log)) for log in logs)
        report.sections.insert(0, ("process logs (last warnings)", text))
    return report


# The tests `make test` runs in its stack lane (tests/lanes.py): those that start stacks of their own
# (several brokers, workers, the supervisor) and kill or stop them; the other lane runs the rest.
# The identity provider's tests too: one Keycloak per run, and they even out the two lanes' times.
STACK_LANE = ("tests/chaos/", "tests/e2e/test_dev_stop.py", "tests/e2e/test_dev_stack.py", "tests/e2e/test_demo.py",
              "tests/e2e/test_oidc.py", "tests/e2e/test_oidc_browser.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(STACK_LANE):
            item.add_marker(pytest.mark.stack_lane)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path_factory.mktemp("postgres"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def keycloak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keycloak]:
    """Keycloak with the test realm (tests/data/keycloak-realm.json); its start-up cost shows as this
    fixture's setup in ``--durations``."""
    server = Keycloak(tmp_path_factory.mktemp("keycloak"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def namespace() -> str:
    """A fresh namespace (topic prefix and schema) per test, so tests never see each other's data."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def db(postgres: PostgresServer, namespace: str) -> AsyncIterator[asyncpg.Connection]:
    admin = await asyncpg.connect(postgres.dsn)
    try:
        await migrate(admin, namespace)
    finally:
        await admin.close()
    conn = await connect(postgres.dsn, namespace)
    yield conn
    await conn.close()
