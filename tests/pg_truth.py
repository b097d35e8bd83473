"""What a pg deposit's webhooks must cause, in the order they were logged, as the gateway's document
states it (gateway-docs/pg-event-order-version-guard.txt, "Code — deposit side": the version guard,
then the switch on data.object.status; DESIGN.md §1 for the effect types and the ledger). Written
from the document, not from app/core/pg.py, so that a test comparing the two can fail."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson


@dataclass
class DepositTruth:
    """The effect keys the merchant must receive (each exactly once) and the user's ledger entries
    (entry key -> amount) for one deposit."""

    effects: list[str] = field(default_factory=list)
    ledger: dict[str, int] = field(default_factory=dict)


def deposit_truth(bodies: Iterable[bytes]) -> DepositTruth:
    """``bodies``: one deposit's webhooks in log order, redeliveries included (where the correlation
    stands among them changes nothing: parked events are applied in log order, DESIGN.md §2.1)."""
    truth = DepositTruth()
    version: int | None = None
    credited: int | None = None  # credited_user_at IS NOT NULL, with the amount credited
    reversed_ = False  # reversed_at IS NOT NULL
    for body in bodies:
        event = orjson.loads(body)
        obj = event["data"]["object"]
        if version is not None and obj["version"] <= version:
            continue  # rowCount = 0: a stale event (a redelivery included) has no side effect
        version = obj["version"]
        dep, status = obj["id"], obj["status"]
        one_shot, snapshot = f"deposit:{dep}", event["id"]  # resource-bound scope; event-snapshot scope
        if status == "settled":
            if credited is None:  # ... AND credited_user_at IS NULL; credit amount_received_minor
                credited = obj["amount_received_minor"]
                truth.effects += [f"{one_shot}:credit_user", f"{one_shot}:release_goods"]
                truth.ledger[f"{one_shot}:credit_user"] = credited
        elif status == "reversed":
            if credited is not None and not reversed_:  # credited_user_at IS NOT NULL AND reversed_at IS NULL
                reversed_ = True
                truth.effects += [f"{one_shot}:debit_user", f"{one_shot}:hold_goods"]
                truth.ledger[f"{one_shot}:debit_user"] = -credited
        elif status in ("expired", "canceled"):
            late = obj.get("is_terminal") is False and obj.get("late_slip_accepted_until")
            truth.effects.append(f"{snapshot}:show_late_slip" if late else f"{snapshot}:fail_order")
        elif status == "under_review":
            truth.effects.append(f"{snapshot}:show_pending_review")
        elif status == "rejected":
            truth.effects.append(f"{snapshot}:fail_order")
        else:  # default: update_order_status
            truth.effects.append(f"{snapshot}:update_order_status")
    return truth
