"""Typed decoding of a verified body against a gateway's msgspec schema (pure layer).

One decode checks every field the core and the projector read (types, 64-bit integers, id and
time shapes; unknown fields are allowed, gateways add them) after ``limits.body_error`` has checked
the body as a whole. A refusal names the field path (``data.object.review: expected object, got
str``) so the quarantined record says what to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from app.gateways import limits

T = TypeVar("T")
# A JSON value as orjson read it from a body and passed on unread: state and rows carry parts of it
# as the gateway sent them (gateways add fields; the typed schema names only those Orderly reads;
# decisions carry the whole body as its bytes, each gateway's ``payload``). It is
# opaque on purpose: what Orderly reads of a body has its type in a schema struct, and a reader of
# one of these values narrows it first.
Json = object
Document = dict[str, Json]  # a body's JSON object (or an object inside it), opaque in the same way


class Body(msgspec.Struct):
    """Base of every schema struct: a JSON object whose unknown fields are skipped (gateways add
    fields); required fields come first."""


@dataclass(frozen=True)
class Refusal:
    code: str  # short and bounded, for metrics
    reason: str  # names the field path


def require_ids(**values: str | None) -> None:
    """In ``__post_init__``: each given id (length already bounded by ``IdText``) is printable."""
    for field, value in values.items():
        if value is not None and not value.isprintable():
            raise ValueError(f"{field}: an id has printable characters only")


def require_times(**values: str | None) -> None:
    """In ``__post_init__``: each given ISO time parses and lies in 2000..2100."""
    for field, value in values.items():
        if value is not None and (problem := limits.time_error(field, value)) is not None:
            raise ValueError(problem)


def decode(decoder: msgspec.json.Decoder[T], raw: bytes) -> T | Refusal:
    """The body decoded against the schema, or why it is refused (the ingest's check: a body it
    takes is also one every reader of the log reads, ``limits.unreadable``)."""
    refusal = whole(raw)
    if refusal is not None:
        return refusal
    return typed(decoder, raw)


def whole(raw: bytes) -> Refusal | None:
    """Why the body as a whole is refused, whatever its schema (``limits.body_error``, then
    ``limits.unreadable``), or None."""
    if (problem := limits.body_error(raw)) is not None:
        return Refusal("invalid", problem)
    if (unread := limits.unreadable(raw)) is not None:
        return Refusal("not_json", unread)
    return None


def typed(decoder: msgspec.json.Decoder[T], raw: bytes | msgspec.Raw, at: str = "") -> T | Refusal:
    """The body (or its part found at path ``at``) decoded against the schema alone: the worker's
    read of a record the ingest checked (:func:`decode`), whose skipped parts need no second look."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:  # a subclass of DecodeError: first
        reason = readable(str(exc), at)
        if reason.startswith("body: expected object"):
            return Refusal("not_json", "body is not a JSON object")
        return Refusal("invalid", reason)
    except (msgspec.DecodeError, RecursionError):
        return Refusal("not_json", "body is not JSON")


def convert(value: Any, into: type[T], at: str) -> T | Refusal:
    """``value`` (a decoded part of the body found at path ``at``) converted to the schema ``into``."""
    try:
        return msgspec.convert(value, into)
    except msgspec.ValidationError as exc:
        return Refusal("invalid", readable(str(exc), at))


_MISSING = re.compile(r"Object missing required field `(.+)`")
_OURS = re.compile(r"([A-Za-z_][A-Za-z0-9_]*): (.*)", re.DOTALL)  # raised by require_ids / require_times


def readable(message: str, at: str = "") -> str:
    """msgspec's ``Expected `object`, got `str` - at `$.data.object.review``` as
    ``data.object.review: expected object, got str``."""
    # msgspec's path, when it gives one, ends the message; a " - at `" inside a quoted value is not it
    # (only the last " - at `$" can be followed by a path with no backtick to the end: one scan, no regex)
    text, sep, where = message.rpartition(" - at `$")
    if not (sep and where.endswith("`") and "`" not in where[:-1]):
        text, where = message, "`"
    where = where[:-1]
    path = join(at, where.removeprefix("."))
    if missing := _MISSING.fullmatch(text):
        path, text = join(path, missing[1]), "required field missing"
    elif ours := _OURS.fullmatch(text):
        path, text = join(path, ours[1]), ours[2]
    else:
        text = text.replace("`", "")
        text = text[:1].lower() + text[1:]
    return f"{path or 'body'}: {text}"


def join(path: str, step: str) -> str:
    if not path or not step:
        return path or step
    return path + step if step.startswith("[") else f"{path}.{step}"


def lenient(decoder: msgspec.json.Decoder[T], raw: bytes) -> T | None:
    """A refused body read again with a schema of ``Any`` fields, for the ids a quarantine record
    can still carry; None when even that fails (not JSON, nested past the decoder's recursion)."""
    try:
        return decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None


def valid_id(value: Any) -> str | None:
    return value if limits.id_error("", value) is None else None


def field(value: Any, *path: str) -> Any:
    """The value at ``path`` inside nested objects of a leniently decoded body, else None."""
    for step in path:
        if not isinstance(value, dict):
            return None
        value = value.get(step)
    return value
