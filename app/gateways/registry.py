"""Every gateway Orderly knows, declared once (pure wiring layer).

A gateway is an adapter (signatures and routing, ``app/gateways/<name>.py``), a reducer (the pure
decisions, ``app/core/<name>.py``), the read-model tables its decisions carry rows for (a
migration in ``projections/migrations/``), and lifecycles for the simulator (its own table,
``app/simulator/lifecycles.py``'s LIFECYCLES: the ingest and the worker read this registry and never
load the simulator). The ingest, the worker, the timeline and replay find all of it here; adding a
gateway is those modules and one ``register`` line at the end of this file (docs/adding-a-gateway.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.core import card as card_core
from app.core import paymos as paymos_core
from app.core import pg as pg_core
from app.core.reducer import Reducer
from app.gateways import card, paymos, pg
from app.gateways.base import Route


class Adapter(Protocol):
    """What the ingest needs of a gateway: proof of origin and where a body goes."""

    def verify(self, raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...], now: float) -> None: ...

    def route(self, raw: bytes) -> Route: ...

    def signed_headers(self, raw: bytes, secret: str, now: float) -> dict[str, str]: ...


@dataclass(frozen=True)
class Table:
    """A read-model table a gateway's decisions fill."""

    name: str
    compared: str  # the columns replay compares with the live namespace (no wall-clock bookkeeping)
    key: str | None = None  # the resource id column, for a table holding a resource's current state
    kind: str | None = None  # what such a table holds (the timeline's "kind")


@dataclass(frozen=True)
class Gateway:
    name: str
    adapter: Adapter
    reducer: Reducer[Any, Any]  # its decisions and the codecs of its state (app/core/reducer.py)
    tables: tuple[Table, ...] = ()
    timestamped: bool = True  # its signature carries a timestamp checked against the clock (±300 s)
    secret_help: str = "signing secret(s), comma-separated for rotation"  # ORDERLY_SECRET_<NAME>'s description
    dev_secret: str = ""  # `orderly dev`'s secret (the gateway simulator signs with it)
    # Optional capabilities (each unset for a gateway without it):
    check_secret: Callable[[str], object] | None = None  # raises ValueError on a secret its scheme cannot use
    # The module of the gateway's other ingest routes, as a path the ingest imports (``add_routes(app,
    # wiring)``), so that this registry, which the worker loads too, never imports the ingest's I/O.
    routes: str | None = None

    def state_queries(self) -> list[tuple[str, str]]:
        """(kind, query) for each table holding a resource's state, in declaration order."""
        return [(t.kind or t.name, f"SELECT * FROM {t.name} WHERE {t.key} = $1") for t in self.tables if t.key]


GATEWAYS: dict[str, Gateway] = {}


def register(gateway: Gateway) -> Gateway:
    """Add a gateway (a second one of the same name replaces the first: tests plug in a toy one)."""
    GATEWAYS[gateway.name] = gateway
    return gateway


def unregister(name: str) -> None:
    GATEWAYS.pop(name, None)


def find(name: str) -> Gateway | None:
    return GATEWAYS.get(name)


register(Gateway("pg", pg, pg_core.REDUCER, secret_help="pg signing secret(s), comma-separated for rotation",
                 dev_secret="dev-pg-secret", routes="app.ingest.correlations", tables=(
    Table("pg_deposits", "pg_deposit_id, pg_version, status, is_terminal, late_slip_accepted_until, "
          "ordered_amount_minor, transferred_amount_minor, amount_received_minor, fee_total_minor, "
          "credited_amount_minor, fee_breakdown, overpayment, our_order_id, our_user_id, credited_user_at, "
          "reversed_at", key="pg_deposit_id", kind="deposit"),
    Table("pg_withdrawals", "pg_withdrawal_id, pg_version, status, amount_total_minor, filled_minor, "
          "remaining_minor, our_payout_id, closed_at", key="pg_withdrawal_id", kind="withdrawal"),
    Table("pg_balance_txns", "btxn_id, type, direction, amount_minor, bucket_from, bucket_to, source_id, created_at",
          key="btxn_id", kind="balance_transaction"),
    Table("pg_deposit_correlations", "pg_deposit_id, merchant_reference, our_order_id, our_user_id"),
    Table("pg_deposit_overpayment_flags", "claim_id, pg_deposit_id, observed_deposit_version, cause, amount_minor, "
          "raw_flag"),
    Table("pg_withdrawal_fills", "leg_ref, pg_withdrawal_id, sequence, amount_minor"),
)))
register(Gateway("card", card, card_core.REDUCER, secret_help="card Standard Webhooks secret(s), `whsec_<base64>`",
                 dev_secret="whsec_ZGV2LWNhcmQtc2VjcmV0LWtleS0wMTIzNDU2Nzg5", check_secret=card.secret_key, tables=(
    Table("card_payments", "payment_ref, state, authorised_minor, captured_minor, refunded_minor, currency",
          key="payment_ref", kind="payment"),
    Table("card_events", "gateway_event_id, payment_ref, event_type, sequence, payload, applied_at IS NOT NULL, "
          "source"),
)))
register(Gateway("paymos", paymos, paymos_core.REDUCER, timestamped=False, secret_help="paymos signing secret(s)",
                 dev_secret="dev-paymos-secret", tables=(
    Table("paymos_invoices", "id, status, is_final, updated_at_ms, snapshot", key="id", kind="invoice"),
    Table("paymos_withdrawals", "id, status, is_final, updated_at_ms, snapshot", key="id", kind="withdrawal"),
    Table("paymos_channel_deposits", "id, status, is_final, updated_at_ms, snapshot", key="id",
          kind="payment_channel_deposit"),
    Table("order_notes", "note_key, resource_id, kind, body"),
)))
