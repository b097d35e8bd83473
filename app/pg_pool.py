"""The asyncpg pools of Orderly's own processes (the ingest's correlations, the sinks, the fetcher),
made one way, and a transaction made again when a migration made its statements stale (I/O shell).

asyncpg resets a connection each time it goes back to its pool: ``SELECT pg_advisory_unlock_all();
CLOSE ALL; UNLISTEN *; RESET ALL`` (``Connection.get_reset_query``), one round trip to PostgreSQL and
four statements there, on every release. The ingest released one for every correlation PUT. This
code keeps no session state for a reset to clear: its advisory locks are transaction-scoped
(``pg_advisory_xact_lock``), it sets no setting for a session, opens no cursor outside a transaction
and listens to nothing (tests/unit/test_pg_pool_premise.py searches for each); ``search_path`` is a
connection parameter, which RESET ALL keeps anyway. So a
release here only rolls back a transaction left open (asyncpg does that before any ``reset`` given
to the pool) and skips the query. The migrations (a session advisory lock) and the admin (an
operator's queries) keep asyncpg's reset.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from projections.migrate import quote_ident

T = TypeVar("T")


async def _nothing_to_reset(_conn: asyncpg.Connection) -> None:
    return None


async def create_pool(dsn: str, namespace: str, **options: Any) -> asyncpg.Pool:
    """A pool on ``namespace``'s schema whose connections go back without asyncpg's reset query."""
    pool: asyncpg.Pool = await asyncpg.create_pool(
        dsn, reset=_nothing_to_reset, server_settings={"search_path": quote_ident(namespace)}, **options)
    return pool


async def prepared_anew(transaction: Callable[[], Awaitable[T]]) -> T:
    """``transaction()``, made once more if a migration made one of its statements stale (a column's
    type changed under it): inside a transaction asyncpg does not prepare it again as it does
    outside one, but drops it from its cache and raises; the transaction was rolled back."""
    try:
        return await transaction()
    except asyncpg.InvalidCachedStatementError:
        return await transaction()
