"""Migrations and the pg document's database guards, on the started PostgreSQL."""

from __future__ import annotations

import asyncpg
import pytest

from app.stack.postgres import PostgresServer
from projections.migrate import available, migrate

DEPOSIT_COLUMNS = (
    "pg_deposit_id, pg_version, status, ordered_amount_minor, transferred_amount_minor, "
    "amount_received_minor, fee_total_minor, credited_amount_minor, our_order_id, our_user_id"
)


async def _table_names(conn: asyncpg.Connection, schema: str) -> set[str]:
    rows = await conn.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema)
    return {r["table_name"] for r in rows}


async def test_migrations_applied_twice_change_nothing(postgres: PostgresServer, namespace: str) -> None:
    conn = await asyncpg.connect(postgres.dsn)
    try:
        first = await migrate(conn, namespace)
        assert first == [f"{m.version:04d}_{m.name}" for m in available()]
        tables = await _table_names(conn, namespace)
        dump = await conn.fetch(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = $1 ORDER BY 1, 2", namespace)
        assert await migrate(conn, namespace) == []
        assert await _table_names(conn, namespace) == tables
        assert await conn.fetch(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = $1 ORDER BY 1, 2", namespace) == dump
        recorded = await conn.fetchval(f'SELECT count(*) FROM "{namespace}".schema_migrations')
        assert recorded == len(available())
    finally:
        await conn.close()


async def test_every_read_model_of_the_design_exists(db: asyncpg.Connection, namespace: str) -> None:
    expected = {
        "pg_deposit_correlations", "pg_deposits", "pg_deposit_overpayment_flags", "pg_withdrawals",
        "pg_withdrawal_fills", "pg_balance_txns", "card_payments", "card_events", "paymos_invoices",
        "paymos_withdrawals", "paymos_channel_deposits", "order_notes", "webhook_events", "effects",
        "ledger_entries", "user_balances", "projector_offsets",
    }
    assert expected <= await _table_names(db, namespace)
    # 🔴 ids are text, never varchar(20): a truncated id cannot be reconciled
    kind = await db.fetchval(
        "SELECT data_type FROM information_schema.columns WHERE table_schema=$1 "
        "AND table_name='pg_deposits' AND column_name='pg_deposit_id'", namespace)
    assert kind == "text"


@pytest.mark.parametrize(
    ("row", "accepted"),
    [
        # consistent: received = least(transferred, ordered), received - fee = credited
        ((5000, 5000, 5000, 100, 4900), True),
        ((5000, 7000, 5000, 100, 4900), True),   # overpaid: received is capped at ordered
        ((5000, 7000, 7000, 100, 6900), False),  # received above ordered
        ((5000, 5000, 5000, 100, 5000), False),  # credited ignores the fee
        ((5000, 5000, 5000, 6000, -1000), False),  # fee above received
        ((5000, 5000, 5000, None, 4900), False),  # a settled row without its fee
        ((0, 0, 0, 0, 0), False),                # nothing received is not settled
    ],
)
async def test_money_check_guards_settled_rows(db: asyncpg.Connection, row: tuple[int | None, ...],
                                               accepted: bool) -> None:
    insert = f"INSERT INTO pg_deposits ({DEPOSIT_COLUMNS}) VALUES ($1, 9, 'settled', $2, $3, $4, $5, $6, 'o', 'u')"
    if accepted:
        await db.execute(insert, "dep_ok", *row)
        assert await db.fetchval("SELECT status FROM pg_deposits WHERE pg_deposit_id='dep_ok'") == "settled"
    else:
        with pytest.raises(asyncpg.CheckViolationError, match="pg_deposit_money_ck"):
            await db.execute(insert, "dep_bad", *row)
    # A pending deposit carries no money yet, so the check does not apply to it.
    await db.execute(
        f"INSERT INTO pg_deposits ({DEPOSIT_COLUMNS}) VALUES ('dep_pending', 1, 'pending', "
        "NULL, NULL, NULL, NULL, NULL, 'o', 'u')")


async def test_overpayment_flags_are_append_only(db: asyncpg.Connection) -> None:
    await db.execute(f"INSERT INTO pg_deposits ({DEPOSIT_COLUMNS}) "
                     "VALUES ('dep_1', 11, 'settled', 5000, 7000, 5000, 0, 5000, 'o', 'u')")
    await db.execute(
        """INSERT INTO pg_deposit_overpayment_flags (claim_id, pg_deposit_id, observed_deposit_version, cause,
             amount_minor, slip_received_at, status_snapshot, action_required_snapshot, raw_flag)
           VALUES ('clm_1', 'dep_1', 11, 'same_transfer_excess', 2000, now(), 'open', 'contact_support', '{}')""")
    with pytest.raises(asyncpg.PostgresError, match="append-only") as update_err:
        await db.execute("UPDATE pg_deposit_overpayment_flags SET amount_minor = 1 WHERE claim_id = 'clm_1'")
    assert update_err.value.sqlstate == "55000"
    with pytest.raises(asyncpg.PostgresError, match="append-only"):
        await db.execute("DELETE FROM pg_deposit_overpayment_flags WHERE claim_id = 'clm_1'")
    assert await db.fetchval("SELECT amount_minor FROM pg_deposit_overpayment_flags") == 2000
