"""Builders of pg gateway events as the gateway sends them (for tests and the simulator)."""

from __future__ import annotations

from typing import Any

import orjson

AMOUNT = 500_000  # 5,000.00 in minor units
FEE = 2_500


def deposit(dep: str, version: int, status: str, event_id: str | None = None, sequence: int | None = None,
            amount: int = AMOUNT, **extra: Any) -> bytes:
    obj: dict[str, Any] = {"id": dep, "object": "deposit", "version": version, "status": status,
                           "ordered_amount_minor": amount, "metadata": {"user_id": "meta_user_never_used"}}
    if status in ("settled", "reversed"):
        obj.update(transferred_amount_minor=amount, amount_received_minor=amount, fee_total_minor=FEE,
                   credited_amount_minor=amount - FEE)
    if status in ("expired", "canceled"):
        obj.update(is_terminal=False, late_slip_accepted_until="2026-11-30T10:04:41Z")
    if status == "under_review":
        obj["review"] = {"reasons": [{"display_th": "กำลังตรวจสอบ", "display_en": "Under review"}]}
    obj.update(extra)
    return orjson.dumps({"id": event_id or f"evt_{dep}_v{version}", "object": "event",
                         "type": f"deposit.{status}", "sequence": sequence if sequence is not None else version,
                         "created": "2026-11-29T10:33:15Z", "data": {"object": obj}})


def withdrawal(wdr: str, version: int, status: str, filled: int, total: int = 1_000_000,
               fill: dict[str, Any] | None = None, event_id: str | None = None, sequence: int | None = None) -> bytes:
    obj = {"id": wdr, "object": "withdrawal", "version": version, "status": status, "amount_total_minor": total,
           "filled_minor": filled, "remaining_minor": total - filled, "metadata": {"payout_id": f"po_{wdr}"}}
    data: dict[str, Any] = {"object": obj}
    if fill is not None:
        data["fill"] = fill
    return orjson.dumps({"id": event_id or f"evt_{wdr}_v{version}", "object": "event",
                         "type": "withdrawal.filled" if status != "settled" else "withdrawal.settled",
                         "sequence": sequence if sequence is not None else version,
                         "created": "2026-11-29T10:33:15Z", "data": data})


def balance_txn(btxn: str, amount: int, type_: str = "deposit", direction: str = "credit",
                bucket_from: str | None = None, bucket_to: str | None = "pending", event_id: str | None = None,
                sequence: int = 1) -> bytes:
    return orjson.dumps({"id": event_id or f"evt_{btxn}", "object": "event", "type": "balance_transaction.created",
                         "sequence": sequence, "created": "2026-11-29T10:33:15Z",
                         "data": {"object": {"id": btxn, "object": "balance_transaction", "type": type_,
                                             "direction": direction, "amount_minor": amount,
                                             "bucket_from": bucket_from, "bucket_to": bucket_to,
                                             "source": {"id": "dep_1"}, "created_at": "2026-11-29T10:33:15Z",
                                             "balance_after": 123}}})
