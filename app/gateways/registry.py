"""Every gateway Orderly knows, declared once (pure wiring layer; DESIGN.md §2.7).

A gateway is an adapter (signatures and routing, ``app/gateways/<name>.py``), a reducer (the pure
decisions, ``app/core/<name>.py``), the read-model tables its decisions carry rows for (a
migration in ``projections/migrations/``), and optional capabilities: the facts it projects, a
fetch from its API, other ingest routes, a reason shown for its parked deliveries. The ingest, the
worker, the projector, the fetcher, the admin, the timeline and replay find all of it here and name
no gateway themselves; adding a gateway is its modules and one ``register`` line at the end of this
file (docs/adding-a-gateway.md). The ingest and the worker load this registry, so it imports neither
the simulator nor any I/O: what lives there is named by a module path string (``routes``) or found
by the gateway's name in that side's own table (the simulator's, the projector's facts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.core import adyen as adyen_core
from app.core import card as card_core
from app.core import paymos as paymos_core
from app.core import pg as pg_core
from app.core import stripe as stripe_core
from app.core.reducer import Reducer
from app.gateways import adyen, card, paymos, pg, stripe
from app.gateways.base import Route

PARKED_CARD_PAYMENTS = """
SELECT payment_ref AS id FROM card_events WHERE applied_at IS NULL AND source = 'webhook'
   AND payment_ref <> ALL($2::text[])
 GROUP BY payment_ref HAVING min(received_at) < now() - make_interval(secs => $1)
 ORDER BY min(received_at) LIMIT 500"""


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
class Fetch:
    """How the fetcher asks the gateway's API for the truth (``ORDERLY_<NAME>_API_URL``, its base URL;
    unset: nothing is fetched). Either or both of:

    - a resource by its id (``resource``, a GET path where ``{id}`` stands for the quoted id): asked
      for each resource ``parked`` finds (SQL: the ids of resources whose deliveries have been
      parked longer than ``$1`` seconds, except the ids in ``$2``) and when an operator asks (an
      ``orderly.fetch`` request ``{"gateway", "kind": kind, id_field: id}``); ``synced(id, answer,
      now_ms)`` makes the JSON answer the raw body appended as a ``synced`` record (ValueError when
      the answer is unusable: nothing is appended); with ``also`` (a second GET path, ``{id}``
      likewise) both are asked and ``synced`` is given the pair of answers, nothing appended unless
      both are 200;
    - the gateway's event log read by sequence (``backfill``, a GET path taking ``since_sequence``
      and ``limit``, answering ``{"data": [events in sequence order]}``): the projector records the
      gaps of the sequence its decisions carry (``pg_sequence_gaps``, under the gateway's name) and
      a gap open too long is requested as ``{"gateway", "kind": "backfill", "since_sequence",
      "until_sequence"}``; each event is routed by the adapter and appended.
    """

    api_help: str  # the description of ORDERLY_<NAME>_API_URL
    resource: str | None = None
    also: str | None = None
    kind: str = ""
    id_field: str = ""
    synced: Callable[[str, object, int], bytes] | None = None
    parked: str | None = None
    # ``parked`` for the resources with rows written at or after ``$3`` (a time) and the ids in ``$4``
    # only, when what it finds older stays found until a fetch settles it (app/fetch_passes.py)
    parked_recent: str | None = None
    backfill: str | None = None
    # the description of ORDERLY_<NAME>_API_KEY (a secret sent as ``Authorization: Bearer`` when
    # set); empty: the gateway's API takes no key, and no such setting exists
    key_help: str = ""


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
    fetch: Fetch | None = None
    # The kinds of fact its decisions carry, each written by the projector as projections/sql.py's
    # FACTS[kind] says, in this order.
    facts: tuple[str, ...] = ()
    parked_because: str = ""  # what a parked delivery waits for, when its decision gives no reason (console)
    # The module of its simulator (``SIMULATOR``, app/simulator/plugins.py), as a path only the
    # simulator imports: `simulate --check`, `orderly dev` and `demo` take the gateways that have one.
    simulator: str | None = None

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
                 dev_secret="dev-pg-secret", routes="app.ingest.correlations", simulator="app.simulator.pg",
                 fetch=Fetch("the pg gateway's API base (`GET /v1/pay/events?since_sequence=N`); unset: no backfill",
                             backfill="/v1/pay/events"),
                 facts=("correlation", "withdrawal_fill", "overpayment_flag"),
                 parked_because="waits for the deposit's correlation (PUT /correlations/pg/deposits/{id})", tables=(
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
                 dev_secret="whsec_ZGV2LWNhcmQtc2VjcmV0LWtleS0wMTIzNDU2Nzg5", check_secret=card.secret_key,
                 simulator="app.simulator.card",
                 fetch=Fetch("the card gateway's API base (`GET /payments/{ref}`); unset: no fetching",
                             resource="/payments/{id}", kind="payment", id_field="payment_ref",
                             synced=card.synced_event, parked=PARKED_CARD_PAYMENTS),
                 facts=("card_event", "card_event_applied"),
                 parked_because="waits for an earlier event of the payment (e.g. a capture before its authorisation, "
                                "a refund above what is captured)", tables=(
    Table("card_payments", "payment_ref, state, authorised_minor, captured_minor, refunded_minor, currency",
          key="payment_ref", kind="payment"),
    Table("card_events", "gateway_event_id, payment_ref, event_type, sequence, payload, applied_at IS NOT NULL, "
          "source"),
)))
register(Gateway("paymos", paymos, paymos_core.REDUCER, timestamped=False, secret_help="paymos signing secret(s)",
                 dev_secret="dev-paymos-secret", facts=("order_note",), simulator="app.simulator.paymos",
                 parked_because="a change out of a terminal state waits for its reorg", tables=(
    Table("paymos_invoices", "id, status, is_final, updated_at_ms, snapshot", key="id", kind="invoice"),
    Table("paymos_withdrawals", "id, status, is_final, updated_at_ms, snapshot", key="id", kind="withdrawal"),
    Table("paymos_channel_deposits", "id, status, is_final, updated_at_ms, snapshot", key="id",
          kind="payment_channel_deposit"),
    Table("order_notes", "note_key, resource_id, kind, body"),
)))
register(Gateway("stripe", stripe, stripe_core.REDUCER,
                 secret_help="stripe endpoint secret(s) `whsec_…`, comma-separated (both while a rolled one lasts)",
                 dev_secret="whsec_dev0stripe0endpoint0secret0key0123", simulator="app.simulator.stripe_history",
                 fetch=Fetch("Stripe's API base, `https://api.stripe.com` (`GET /v1/payment_intents/{id}`, "
                             "`GET /v1/refunds`); unset: the payloads alone decide",
                             resource=stripe.INTENT_PATH, also=stripe.REFUNDS_PATH, kind="payment_intent",
                             id_field="payment_intent", synced=stripe.synced, parked=stripe_core.FETCH_WANTED,
                             parked_recent=stripe_core.FETCH_WANTED_RECENT,
                             key_help="Stripe secret key `sk_…`, sent as `Authorization: Bearer` (unset: none sent)"),
                 parked_because="a thin event waits for its PaymentIntent fetched from Stripe's API", tables=(
    Table("stripe_payment_intents", "id, status, amount_minor, amount_received_minor, amount_refunded_minor, "
          "currency, dispute_status, updated_at", key="id", kind="payment_intent"),
)))
register(Gateway("adyen", adyen, adyen_core.REDUCER, timestamped=False,
                 secret_help="adyen HMAC key(s) in hex, comma-separated for rotation",
                 dev_secret="00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF",
                 check_secret=adyen.secret_key, simulator="app.simulator.adyen",
                 parked_because="waits for an earlier notification of the payment (e.g. a CAPTURE before its "
                                "AUTHORISATION); Adyen has no API to fetch it", tables=(
    Table("adyen_payments", "psp_reference, merchant_reference, state, authorised_minor, captured_minor, "
          "refunded_minor, currency, updated_at", key="psp_reference", kind="payment"),
)))
