"""The pools of Orderly's own processes (app/pg_pool.py) against a real PostgreSQL: a connection goes
back without asyncpg's reset query (its session settings stay: the reason the code keeps none), a
transaction left open is rolled back all the same, and the namespace's schema is every connection's
search_path."""

from __future__ import annotations

import uuid

import asyncpg

from app import pg_pool
from app.stack.postgres import PostgresServer
from projections.migrate import quote_ident


async def test_a_released_connection_keeps_its_session_but_no_open_transaction(postgres: PostgresServer) -> None:
    schema = f"pool{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(postgres.dsn)
    await admin.execute(f"CREATE SCHEMA {quote_ident(schema)}; CREATE TABLE {quote_ident(schema)}.t (n int)")
    pool = await pg_pool.create_pool(postgres.dsn, schema, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            backend = await conn.fetchval("SELECT pg_backend_pid()")
            await conn.execute("SET application_name = 'kept'")
            transaction = conn.transaction()
            await transaction.start()
            await conn.execute("INSERT INTO t VALUES (1)")  # the schema's table, by the search_path
            # released with the transaction open, as a cancelled batch would leave it
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == backend  # the same connection
            assert await conn.fetchval("SHOW application_name") == "kept"  # no RESET ALL was sent
            assert await conn.fetchval("SELECT count(*) FROM t") == 0  # rolled back
            assert await conn.fetchval("SELECT current_setting('transaction_isolation')") == "read committed"
            assert not conn.is_in_transaction()
    finally:
        await pool.close()
        await admin.execute(f"DROP SCHEMA {quote_ident(schema)} CASCADE")
        await admin.close()


async def test_asyncpgs_own_pool_would_have_reset_it(postgres: PostgresServer) -> None:
    """The control: the same steps on asyncpg's default pool lose the session setting."""
    pool = await asyncpg.create_pool(postgres.dsn, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            await conn.execute("SET application_name = 'kept'")
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW application_name") != "kept"
    finally:
        await pool.close()
