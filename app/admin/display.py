"""How the console and the operator commands show amounts and times (pure logic; DESIGN.md §3.1).

Amounts are integer minor units everywhere (DESIGN §2): shown here with their currency, the integer
split at the currency's ISO 4217 exponent — integer arithmetic, never a float. JSON answers keep
the raw integer; this is for people reading a table. Times are ISO 8601 with their zone, in UTC
(``2026-11-29T10:02:16Z``): a time without a zone is a guess for whoever reads it elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

# ISO 4217 currencies whose minor unit is not a hundredth (the list's "minor unit" column); every
# other three-letter code has two decimals, as Stripe and Adyen count them.
EXPONENT: dict[str, int] = {
    **dict.fromkeys(("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND",
                     "VUV", "XAF", "XOF", "XPF"), 0),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
    **dict.fromkeys(("CLF", "UYW"), 4),
}
_CODE = re.compile(r"^[A-Za-z]{3}$")


def exponent(currency: str) -> int | None:
    """Decimals of ``currency`` (case-insensitive, Stripe sends lower case); None for what is not a
    three-letter code (its minor units cannot be split without a guess)."""
    if not _CODE.match(currency):
        return None
    return EXPONENT.get(currency.upper(), 2)


def money(minor: int, currency: str) -> str:
    """``8000, "EUR"`` → ``80.00 EUR``; ``500, "jpy"`` → ``500 JPY``; ``-1234, "KWD"`` → ``-1.234 KWD``."""
    places = exponent(currency)
    if places is None:
        return f"{minor} minor units of {currency}"
    sign = "-" if minor < 0 else ""
    whole, fraction = divmod(abs(minor), 10 ** places)
    text = f"{sign}{whole}" + (f".{fraction:0{places}d}" if places else "")
    return f"{text} {currency.upper()}"


def amounts(row: Mapping[str, Any]) -> dict[str, str]:
    """Each integer ``…_minor`` field of a state row or body with the row's ``currency``, formatted;
    nothing when the row names no currency (pg's deposits: its document gives none)."""
    currency = row.get("currency")
    if not isinstance(currency, str) or not currency:
        return {}
    return {key: money(value, currency) for key, value in row.items()
            if key.endswith("_minor") and isinstance(value, int) and not isinstance(value, bool)}


def zoned(value: datetime) -> str:
    """ISO 8601 in UTC with its zone, to the second: ``2026-11-29T10:02:16Z``."""
    return value.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def gateway_time(value: Any) -> str:
    """A gateway's own time as it sent it when that is ISO 8601; digits (Stripe's seconds, paymos'
    milliseconds) as ISO 8601 in UTC, with the raw number kept beside it."""
    text = "" if value is None else str(value)
    if text.isascii() and text.isdigit() and 9 <= len(text) <= 14:
        number = int(text)
        seconds, millis = (number // 1000, number % 1000) if len(text) >= 12 else (number, 0)
        when = datetime.fromtimestamp(seconds, UTC).replace(microsecond=millis * 1000)
        stamp = when.isoformat(timespec="milliseconds" if len(text) >= 12 else "seconds")
        return f"{stamp.replace('+00:00', 'Z')} ({text})"
    return text


def _money_of(minor: Any, currency: Any) -> str | None:
    if isinstance(minor, int) and not isinstance(minor, bool) and isinstance(currency, str) and currency:
        return money(minor, currency)
    return None


def delivery_amount(payload: Any) -> str:
    """The amount a delivery's body names, with its currency, where the gateway's document puts it
    (card ``amount_minor``, Stripe ``data.object.amount``, Adyen ``amount.value``); else ""."""
    if not isinstance(payload, dict):
        return ""
    obj = payload.get("data", {}).get("object") if isinstance(payload.get("data"), dict) else None
    amount = payload.get("amount")
    found = (_money_of(payload.get("amount_minor"), payload.get("currency"))
             or (_money_of(obj.get("amount"), obj.get("currency")) if isinstance(obj, dict) else None)
             or (_money_of(amount.get("value"), amount.get("currency")) if isinstance(amount, dict) else None))
    return found or ""
