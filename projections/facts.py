"""How the projector writes each kind of fact a gateway's decisions carry (projection layer).

A gateway's registry line lists the kinds of fact it emits (``Gateway.facts``, in the order they are
written); this table says, per kind, which statement writes one and with which arguments. The
projector names no gateway: a new gateway adds its kinds here and to its registry line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from projections import sql
from projections.bulk import Bulk

Args = Callable[[Mapping[str, Any]], Sequence[Any]]


@dataclass(frozen=True)
class FactWrite:
    """The write of one kind of fact, inside the projector's batch transaction.

    ``statement`` is a bulk insert (projections/bulk.py) of every such fact of the batch, or, with
    ``update``, a statement run once per fact. With ``same`` the facts are unique by content: each is
    inserted alone, and one already there (the statement answers NULL) must match ``same`` (its
    arguments: ``same_args`` of the insert's), else the projector records a ``collision`` error.
    """

    statement: Bulk | str
    args: Args
    before_rows: bool = False  # written before the read-model rows of the batch
    update: bool = False
    same: str | None = None
    same_args: Callable[[Sequence[Any]], Sequence[Any]] = tuple
    collision: str = ""


def _flag(data: Mapping[str, Any]) -> Sequence[Any]:
    flag = data["flag"]
    return (data["claim_id"], data["pg_deposit_id"], data["observed_deposit_version"], flag.get("cause"),
            flag.get("amount_minor"), flag.get("slip_received_at"), flag.get("status"),
            flag.get("action_required"), flag.get("expected_response_at"), orjson.dumps(flag).decode())


FACTS: dict[str, FactWrite] = {
    "correlation": FactWrite(sql.CORRELATIONS, lambda c: (
        c["pg_deposit_id"], c["merchant_reference"], c["our_order_id"], c["our_user_id"]), before_rows=True),
    "withdrawal_fill": FactWrite(sql.FILLS, lambda f: (
        f["leg_ref"], f["pg_withdrawal_id"], f.get("sequence"), f["amount_minor"], f.get("fee_recognized_minor"),
        f.get("settled_at"), f.get("auto_confirm_at"), f.get("balance_transaction_id"))),
    # the same claim from a newer snapshot is fine (the deposit's version is not compared); other content never is
    "overpayment_flag": FactWrite(sql.INSERT_FLAG, _flag, same=sql.SAME_FLAG,
                                  same_args=lambda a: (a[0], a[1], *a[3:]), collision="overpayment_claim_collision"),
    "card_event": FactWrite(sql.CARD_EVENTS, lambda e: (
        e["gateway_event_id"], e["payment_ref"], e["event_type"], e["sequence"], e["occurred_at"],
        e["received_at"], e["payload"].encode(), e["source"])),
    "card_event_applied": FactWrite(sql.MARK_CARD_EVENT_APPLIED, lambda f: (f["gateway_event_id"], f["applied_at"]),
                                    update=True),
    "order_note": FactWrite(sql.NOTES, lambda n: (n["note_key"], n["resource_id"], n["kind"], n["body"])),
}
