"""Forward-only migration runner: applies ``migrations/NNNN_name.sql`` in order, once each.

Each namespace is a PostgreSQL schema (``orderly`` live, another for a replay). Applied files are
recorded with a checksum; editing an applied file is refused, because the live database would no
longer match what a fresh one gets.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# One lock id for every Orderly migration run, so two processes starting at once apply each file once.
_LOCK_ID = 0x0D3E_A11


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


class MigrationError(RuntimeError):
    pass


def available() -> list[Migration]:
    found = []
    for entry in sorted(MIGRATIONS_DIR.iterdir()):
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a number: {versions}")
    return found


def quote_ident(name: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise MigrationError(f"schema name {name!r}: lowercase letters, digits and '_' only")
    return f'"{name}"'


async def migrate(conn: asyncpg.Connection, schema: str = "orderly") -> list[str]:
    """Apply pending migrations into ``schema``; return the names applied (empty when up to date)."""
    ident = quote_ident(schema)
    applied_now: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_ID)
    try:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ident}")
        await conn.execute(
            f"""CREATE TABLE IF NOT EXISTS {ident}.schema_migrations (
                  version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
                  applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        rows = await conn.fetch(f"SELECT version, name, checksum FROM {ident}.schema_migrations")
        done = {r["version"]: r for r in rows}
        for m in available():
            if m.version in done:
                if done[m.version]["checksum"] != m.checksum:
                    raise MigrationError(
                        f"migration {m.version:04d}_{m.name} was edited after it was applied; "
                        "add a new migration instead"
                    )
                continue
            async with conn.transaction():
                await conn.execute(f"SET LOCAL search_path TO {ident}")
                await conn.execute(m.sql)
                await conn.execute(
                    f"INSERT INTO {ident}.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    m.version, m.name, m.checksum,
                )
            applied_now.append(f"{m.version:04d}_{m.name}")
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_ID)
    return applied_now


async def connect(dsn: str, schema: str = "orderly") -> asyncpg.Connection:
    """A connection whose unqualified table names resolve in ``schema``."""
    return await asyncpg.connect(dsn, server_settings={"search_path": schema})
