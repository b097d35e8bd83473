"""The limits every input must keep (DESIGN.md §2.4), shared by the adapters and the correlation
API (pure layer).

A gateway, a bug in one, or whoever holds a leaked secret can send a validly signed body of any
shape; these are the bounds past which Orderly refuses a value instead of carrying it into state,
topics and tables (PostgreSQL's index rows, orjson's 64-bit integers, Python's recursion).
"""

from __future__ import annotations

from typing import Any

ID_MAX = 200
DEPTH_MAX = 32
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UNIX_MS_MIN = 946_684_800_000  # 2000-01-01T00:00:00Z
UNIX_MS_MAX = 4_102_444_800_000  # 2100-01-01T00:00:00Z


def id_error(field: str, value: Any) -> str | None:
    """Why ``value`` is not an id (1-200 printable characters, no NUL), or None if it is one."""
    if not isinstance(value, str):
        return f"{field}: expected a string id, got {type(value).__name__}"
    if not 1 <= len(value) <= ID_MAX:
        return f"{field}: an id has 1-{ID_MAX} characters, got {len(value)}"
    if not value.isprintable():  # NUL, other control characters, line breaks
        return f"{field}: an id has printable characters only"
    return None


def int64_error(field: str, value: Any) -> str | None:
    """Why ``value`` is not a signed 64-bit integer (a bool or a float never is), or None."""
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{field}: expected an integer, got {type(value).__name__}"
    if not INT64_MIN <= value <= INT64_MAX:
        return f"{field}: integer outside the signed 64-bit range"
    return None


def depth(value: Any) -> int:
    """How deeply arrays and objects nest in a decoded JSON value (a scalar is 0), iteratively."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def may_nest_deeper(raw: bytes, limit: int = DEPTH_MAX) -> bool:
    """False when ``raw`` cannot nest deeper than ``limit``: it opens no more arrays and objects
    than that in all (a count in C, so the common body needs no walk of its decoded value)."""
    return raw.count(b"{") + raw.count(b"[") > limit
