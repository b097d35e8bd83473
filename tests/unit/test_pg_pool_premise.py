"""app/pg_pool.py's premise, kept: the pools it makes return a connection without asyncpg's reset
query, so the code using them must keep no session state for a later user of the connection to
inherit. Every module of the processes on those pools (app/, projections/; not the migrations nor the
admin, whose pool keeps asyncpg's reset) is searched for a statement that would leave some: a
session-level SET, a session advisory lock, LISTEN, a temporary table, a cursor declared by name."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEPT_RESET = {"projections/migrate.py"}  # its own connection, not a pool of pg_pool's
SESSION_STATE = [
    # SQL keywords as this code writes them, in capitals: a message saying "set ... on every broker" is none
    re.compile(r"""["'(]\s*SET\s+(?!LOCAL\b)(SESSION\s+)?[a-z_.]+\s*(=|TO\b)"""),
    re.compile(r"pg_advisory_lock(_shared)?\s*\(", re.IGNORECASE),
    re.compile(r"""["'(]\s*LISTEN\s"""),
    re.compile(r"CREATE\s+(TEMP|TEMPORARY)\s+TABLE", re.IGNORECASE),
    re.compile(r"DECLARE\s+\w+\s+(BINARY\s+)?(INSENSITIVE\s+)?(NO\s+)?(SCROLL\s+)?CURSOR", re.IGNORECASE),
]


def sources() -> list[Path]:
    found = [*(ROOT / "app").rglob("*.py"), *(ROOT / "projections").rglob("*.py")]
    return [p for p in found if "admin" not in p.relative_to(ROOT).parts
            and str(p.relative_to(ROOT)) not in KEPT_RESET]


def test_no_module_on_the_pools_leaves_session_state() -> None:
    offending = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
                 for p in sources() for n, line in enumerate(p.read_text().splitlines(), 1)
                 if any(rule.search(line) for rule in SESSION_STATE)]
    assert offending == []


def test_the_search_finds_what_it_looks_for() -> None:
    caught = ['conn.execute("SET search_path = x")', "'SET SESSION statement_timeout TO 5'",
              'await conn.execute("SELECT pg_advisory_lock(1)")', '"LISTEN changes"',
              '"CREATE TEMP TABLE t (x int)"', '"DECLARE c CURSOR FOR SELECT 1"']
    passed = ['"SET LOCAL search_path TO x"', '"UPDATE effects SET dead_at = NULL"',
              '"SELECT pg_advisory_xact_lock(7)"', "SET = {1}"]
    assert all(any(rule.search(text) for rule in SESSION_STATE) for text in caught)
    assert not any(rule.search(text) for text in passed for rule in SESSION_STATE)
