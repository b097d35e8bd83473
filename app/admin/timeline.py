"""A resource's timeline in gateway order or in arrival order, and where the two differ (pure
logic; DESIGN.md §3.1, issue #48).

Arrival order is the order deliveries reached the ingest (``received_at``, then the log's order).
Gateway order is the order the gateway gave them, read from the ordering fields each body carries
(the same the reducers order by): pg's ``version``, a card event's ``sequence``, and the gateway's
own time (pg ``created``, card ``occurred_at``, paymos ``data.updated_at`` in ms, Stripe ``created``
in seconds, Adyen ``eventDate``). A delivery without any (a correlation, a body set aside at the
ingest) has no gateway position and goes last in gateway order, in arrival order.

A delivery is ``late`` when it arrived after a delivery the gateway placed after it: the case the
version guard and parking exist for, and what an operator looks for first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

Order = Literal["arrival", "gateway"]
ORDERS: tuple[Order, ...] = ("arrival", "gateway")
GatewayKey = tuple[int, int, int]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def order_of(text: str | None) -> Order | None:
    """The order a query names (none: arrival); None for one that is not an order."""
    if text in (None, "", "arrival"):
        return "arrival"
    return "gateway" if text == "gateway" else None


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.removeprefix("-").isdigit() and len(value) <= 20:
        return int(value)
    return None


def instant(value: Any) -> int | None:
    """A gateway time as a comparable integer: ISO 8601 with a zone as microseconds since the epoch,
    digits as they are (a resource's deliveries come from one gateway, so one unit); else None."""
    number = _whole(value)
    if number is not None:
        return number
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return (when - EPOCH) // timedelta(microseconds=1)


def gateway_key(delivery: Mapping[str, Any]) -> GatewayKey | None:
    """(version, sequence, time) of a delivery as the gateway ordered it; a missing part is -1;
    None when the delivery carries none of them."""
    parts = (_whole(delivery.get("version")), _whole(delivery.get("sequence")), instant(delivery.get("gateway_time")))
    if all(p is None for p in parts):
        return None
    return (parts[0] if parts[0] is not None else -1, parts[1] if parts[1] is not None else -1,
            parts[2] if parts[2] is not None else -1)


def ordered(deliveries: Sequence[dict[str, Any]], order: Order) -> list[dict[str, Any]]:
    """The deliveries (given in arrival order) with ``arrival`` (1-based), ``gateway_position``
    (1-based, None without a gateway key) and ``late``, listed in ``order``."""
    keys = [gateway_key(d) for d in deliveries]
    by_gateway = sorted(range(len(deliveries)), key=lambda i: (keys[i] is None, keys[i] or (0, 0, 0), i))
    position = {i: n + 1 for n, i in enumerate(j for j in by_gateway if keys[j] is not None)}
    out = []
    latest: GatewayKey | None = None  # the greatest gateway key among those that arrived before
    for i, delivery in enumerate(deliveries):
        key = keys[i]
        late = key is not None and latest is not None and key < latest
        if key is not None and (latest is None or key > latest):
            latest = key
        out.append({**delivery, "arrival": i + 1, "gateway_position": position.get(i), "late": late})
    return out if order == "arrival" else [out[i] for i in by_gateway]
