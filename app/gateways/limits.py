"""The limits every input must keep (DESIGN.md §2.4), shared by the adapters and the correlation
API (pure layer).

A gateway, a bug in one, or whoever holds a leaked secret can send a validly signed body of any
shape; these are the bounds past which Orderly refuses a value instead of carrying it into state,
topics and tables (PostgreSQL's index rows, bigint and jsonb, orjson's 64-bit integers, Python's
recursion). The typed aliases below carry them into the adapters' msgspec schemas.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
import orjson
from msgspec import Meta

ID_MAX = 200
# A delivery id the admin takes (its paths, its search): room for every one Orderly makes. The longest
# are the fetcher's, fetch-<event id>~<12 hex digits>, and card's fetched event ids run to about 270
# characters (app/gateways/card.py synced_body; tests/unit/test_fetch_limits.py checks each gateway's).
DELIVERY_ID_MAX = 512
DEPTH_MAX = 32
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SMALLINT_MAX = 2**15 - 1  # PostgreSQL smallint: pg_withdrawal_fills.sequence, pg_withdrawals.settled_splits
UNIX_MS_MIN = 946_684_800_000  # 2000-01-01T00:00:00Z
UNIX_MS_MAX = 4_102_444_800_000  # 2100-01-01T00:00:00Z
DECIMAL_MAX = 80  # characters of a crypto amount: 18 decimals on a 60-digit integer part is plenty

# Typed fields for the adapters' msgspec schemas: the decoder enforces these bounds in C.
Int64 = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)]
Minor = Annotated[int, Meta(ge=0, le=INT64_MAX)]  # money in minor units: never negative, never a float
Seq = Annotated[int, Meta(ge=0, le=INT64_MAX)]  # sequences
SmallCount = Annotated[int, Meta(ge=0, le=SMALLINT_MAX)]
UnixMs = Annotated[int, Meta(ge=UNIX_MS_MIN, le=UNIX_MS_MAX)]
UnixS = Annotated[int, Meta(ge=UNIX_MS_MIN // 1000, le=UNIX_MS_MAX // 1000)]
Text = Annotated[str, Meta(min_length=1, max_length=ID_MAX)]  # a type, a status, a currency
# Not "." nor "..": the fetcher builds its gateway API URLs from ids, and such a path segment collapses
# (a card payment_ref ".." fetched the API's root). An id of other dots, or holding "/", is the fetcher's
# to percent-encode.
NOT_DOTS = r"^(?!\.\.?\Z)"
IdText = Annotated[str, Meta(min_length=1, max_length=ID_MAX, pattern=NOT_DOTS)]  # and printable: see id_error
# An id in a body the ingest's schema took already (the worker's read of a record it checked): its
# length is checked again in C, the dots pattern and printability are not. msgspec runs a pattern
# through Python's re per value, about 550 ns, more than decoding the rest of a pg or paymos body.
TakenId = Annotated[str, Meta(min_length=1, max_length=ID_MAX)]
DecimalText = Annotated[str, Meta(pattern=r"^-?[0-9]+(\.[0-9]+)?$", max_length=DECIMAL_MAX)]
IsoText = Annotated[str, Meta(max_length=40)]  # and see time_error

# RFC 3339 with ASCII digits: what Python's fromisoformat (the card core), PostgreSQL's timestamptz
# and every other consumer of the log read alike. The zone may be omitted; it then reads as UTC.
_ISO_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
                       r"(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})?")
# 19 digits in a row may leave signed 64 bits, 18 never do: found by a translate and a find in C
# (a regex takes ten times as long). Every other byte becomes "." first: CPython's substring search
# crawls (5 ms a megabyte) through some texts, such as a long run of one letter, but not through that.
_DIGITS_AS_ZERO = bytes(ord("0") if ord("0") <= i <= ord("9") else ord(".") for i in range(256))
_NINETEEN_DIGITS = b"0" * 19
# A number beyond a double's range (orjson, PostgreSQL's jsonb and msgspec refuse it; a typed schema
# skips an unknown field unread) has an exponent of three digits at least, or a run of 19 digits and
# more: found in the same translation, with e and E as "e" and + as "+" (a negative exponent only
# rounds towards zero); so has one of FLOAT_MAX or more. A string such as an id can hold such a run
# too: it costs a full read, no more.
_NUMBERISH = bytes(ord("0") if ord("0") <= i <= ord("9") else ord("e") if i in b"eE" else ord("+") if i == ord("+")
                   else ord(".") for i in range(256))
_BIG_EXPONENTS = (b"0e000", b"0e+000")
_LONG_EXPONENTS = (*_BIG_EXPONENTS, b"0e.000")  # and a negative one ("-" reads as ".")
# Every exponent above starts with a digit and an "e": a body with no such pair (most, though their
# keys are full of e's) is cleared by one search instead of one per exponent (about 1 µs a body).
_EXPONENT = b"0e"
# msgspec, the decoder of the ingest's schemas and of the log's readers, reads a number of 1e289 or
# more about 300 times slower than another (7 µs: a 1 MiB body of them held a process over a second);
# orjson does not. No gateway sends one: refused at the edge, so no process meets it.
FLOAT_MAX = 1e288
# The float_hook of every decoder that reads untrusted JSON into Any fields before the checks above
# (an adapter's lenient Head, Adyen's signed fields, read before the signature is checked): Python's
# float() reads 1e300 at its usual speed, where msgspec takes 7 µs (an unsigned 1 MiB request of
# them held the ingest 1.2 s). Out of a double's range it gives inf instead of refusing: those
# readers only look for ids and signed texts, which a number never is.
FLOAT_HOOK = float
# body_error's read of a whole body (the shape, integers and strings), its floats through the hook
# too: unreadable checks their range, with orjson.
_SHAPE = msgspec.json.Decoder(float_hook=FLOAT_HOOK)
_NUL = b"\\u0000"  # the only way a NUL reaches a JSON string; PostgreSQL text and jsonb refuse it


def id_error(field: str, value: Any, most: int = ID_MAX) -> str | None:
    """Why ``value`` is not an id (1-``most`` printable characters, no NUL), or None if it is one."""
    if not isinstance(value, str):
        return f"{field}: expected a string id, got {type(value).__name__}"
    if not 1 <= len(value) <= most:
        return f"{field}: an id has 1-{most} characters, got {len(value)}"
    if not value.isprintable():  # NUL, other control characters, line breaks
        return f"{field}: an id has printable characters only"
    if value in (".", ".."):
        return f"{field}: an id may not be {value!r} (a URL path segment built from it would collapse)"
    return None


def int64_error(field: str, value: Any) -> str | None:
    """Why ``value`` is not a signed 64-bit integer (a bool or a float never is), or None."""
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{field}: expected an integer, got {type(value).__name__}"
    if not INT64_MIN <= value <= INT64_MAX:
        return f"{field}: integer outside the signed 64-bit range"
    return None


def may_nest_deeper(raw: bytes, limit: int = DEPTH_MAX) -> bool:
    """False when ``raw`` cannot nest deeper than ``limit``: it opens no more arrays and objects
    than that in all (a count in C, so the common body needs no walk of its decoded value)."""
    return raw.count(b"{") + raw.count(b"[") > limit


def time_error(field: str, value: str) -> str | None:
    """Why ``value`` is not an ISO 8601 time between 2000-01-01 and 2100-01-01, or None."""
    if not _ISO_TIME.fullmatch(value):
        return f"{field}: expected an ISO 8601 time YYYY-MM-DDTHH:MM:SS[.f][Z|±HH:MM], got {value[:40]!r}"
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return f"{field}: not a calendar time: {value!r}"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if not UNIX_MS_MIN <= moment.timestamp() * 1000 <= UNIX_MS_MAX:
        return f"{field}: time outside 2000-01-01..2100-01-01"
    return None


def body_error(raw: bytes) -> str | None:
    """Why the JSON body breaks a limit anywhere, typed field or not, or None.

    Nesting past DEPTH_MAX overflows orjson's and msgspec's recursion; an integer outside signed 64
    bits or a NUL breaks orjson, PostgreSQL's bigint and jsonb. Three scans in C clear the usual
    body; only a body that may hold one of them is decoded and walked. Not JSON: None (the typed
    decoder reports it).
    """
    if not (may_nest_deeper(raw) or may_hold_nul(raw) or may_hold_big_int(raw)):
        return None
    try:
        value = _SHAPE.decode(raw)
    except RecursionError:
        return f"body: JSON nests deeper than {DEPTH_MAX}"
    except msgspec.DecodeError:
        return None
    return value_error(value)


def may_hold_nul(raw: bytes) -> bool:
    return b"\\" in raw and _NUL in raw  # a one-byte test first: the substring search is the slow one


def may_hold_big_int(raw: bytes) -> bool:
    return _NINETEEN_DIGITS in raw.translate(_DIGITS_AS_ZERO)


def long_numbers(raw: bytes) -> bool:
    """Whether ``raw`` may hold a number of 19 digits or more, or with an exponent of three digits or
    more of either sign: such as a number PostgreSQL's jsonb refuses as written (more than 16,383
    digits after the decimal point: ``1e-16384``, a long fraction) though every reader of the log
    reads it (the fraction rounds in a double). A string holding such a run of digits: True too."""
    numberish = raw.translate(_NUMBERISH)
    return _NINETEEN_DIGITS in numberish or (_EXPONENT in numberish
                                             and any(long in numberish for long in _LONG_EXPONENTS))


def unreadable(raw: bytes) -> str | None:
    """Why ``raw`` is not JSON that every reader of the log reads, in a part a typed schema skips
    unread (an unknown field, ``msgspec.Raw``), or None: bytes that are not UTF-8, or a number beyond
    a double's range; or a number of FLOAT_MAX or more anywhere. The ingest checks it (schema.decode),
    so a record it marks checked can be read by a typed decode alone and its bytes carried on as they
    are (DESIGN.md §2.4). A body that is not JSON at all: None (the typed decoder reports it)."""
    if not raw.isascii():
        try:
            raw.decode()
        except UnicodeDecodeError as exc:
            return f"body: not UTF-8 (byte {exc.start})"
    numberish = raw.translate(_NUMBERISH)
    if not (_NINETEEN_DIGITS in numberish
            or (_EXPONENT in numberish and any(big in numberish for big in _BIG_EXPONENTS))):
        return None
    try:  # orjson: it reads such numbers at the usual speed, and refuses one past a double
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:  # "number is infinity when parsed as double: line 1 …"
        return "body: a number beyond a double's range (JSON readers refuse it)" if "infinity" in str(exc) else None
    return float_error(value)


def float_error(value: Any) -> str | None:
    """Why a decoded JSON value holds a number of FLOAT_MAX or more (iteratively), or None."""
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            stack.extend(node.values())
        elif type(node) is list:
            stack.extend(node)
        elif type(node) is float and not -FLOAT_MAX < node < FLOAT_MAX:
            return f"body: a number of 1e288 or more ({node:g}): no gateway sends one"
    return None


def value_error(value: Any) -> str | None:
    """The first path in a decoded JSON value that nests too deep, holds an integer outside signed
    64 bits or a string (or key) with a NUL, iteratively; None if there is none."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, path, level = stack.pop()
        if isinstance(node, dict | list):
            if level >= DEPTH_MAX:
                return f"{path or 'body'}: JSON nests deeper than {DEPTH_MAX}"
            if isinstance(node, dict):
                for key, child in node.items():
                    if "\x00" in key:
                        return f"{path or 'body'}: a key holds a NUL character"
                    stack.append((child, f"{path}.{key}" if path else key, level + 1))
            else:
                stack.extend((child, f"{path}[{i}]", level + 1) for i, child in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool):
            if not INT64_MIN <= node <= INT64_MAX:
                return f"{path or 'body'}: integer outside the signed 64-bit range"
        elif isinstance(node, str) and "\x00" in node:
            return f"{path or 'body'}: a string holds a NUL character"
    return None
