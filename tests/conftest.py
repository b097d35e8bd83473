"""Real infrastructure for the tests: one Apache Kafka broker and one PostgreSQL server per session.

Both are started by the project's own helpers. Nothing here skips: a broker that cannot start is a
test failure, in CI as anywhere else.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import hypothesis  # noqa: F401  (before any test: on CPython 3.11.7 a later first import, from its terminal-summary hook, failed with SystemError: AST constructor recursion depth)
import pytest

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from projections.migrate import connect, migrate


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
