"""Builders of paymos events as the gateway sends them."""

from __future__ import annotations

from typing import Any

import orjson

FINAL = {"paid", "paid_over", "underpaid", "expired", "cancelled", "completed", "failed", "confirmed"}
OBJECT = {"invoice": "invoice", "withdrawal": "withdrawal", "payment_channel": "payment_channel_deposit"}


def event(event_type: str, rid: str, status: str, updated_at: int, event_id: str | None = None,
          **extra: Any) -> bytes:
    family = event_type.split(".")[0]
    data = {"id": rid, "object": OBJECT[family], "status": status, "is_final": status in FINAL,
            "updated_at": updated_at, **extra}
    return orjson.dumps({"event_id": event_id or f"evt_{rid}_{event_type}_{updated_at}", "event_type": event_type,
                         "created_at": updated_at, "data": data})
