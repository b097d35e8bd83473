"""Start-up work every process shares: topics exist with their settings, migrations are applied."""

from __future__ import annotations

import asyncpg

from app.settings import Settings
from projections.migrate import migrate
from topics.admin import ensure_topics
from topics.catalog import catalog


async def prepare(settings: Settings) -> tuple[list[str], list[str]]:
    """Idempotent; returns (topics created, migrations applied)."""
    created = await ensure_topics(
        settings.kafka_bootstrap,
        catalog(settings.namespace, settings.partitions, settings.replication_factor))
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        applied = await migrate(conn, settings.namespace)
    finally:
        await conn.close()
    return created, applied
