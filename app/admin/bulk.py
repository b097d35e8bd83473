"""Bulk retry and redrive by filter (I/O layer over the read models and orderly.raw; DESIGN.md §3.1).

``POST /api/effects/retry`` and ``POST /api/quarantine/redrive`` (and `orderly effects retry` /
`orderly quarantine redrive` without an id) act on every row a filter matches — gateway, type (an
effect's type; a quarantined record's stage), state, a time range — at most ``MOST_PER_CALL`` rows a
call, oldest first, so one call is bounded in time and in what it can do by mistake. ``dry_run``
answers the count and changes nothing. A bulk action is written to the audit as ONE row naming the
filter and its count (the one-at-a-time actions write one row each, app/admin/actions.py).

The filter's parsing is pure (:func:`parse_filter`), shared by the API's query parameters and the
commands' options.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Literal

from app.admin import actions
from app.gateways import registry
from app.pg_pool import prepared_anew
from app.producer import KeyedProducer
from projections.bulk import Conn
from topics.catalog import TopicNames

MOST_PER_CALL = 1000  # rows one bulk call acts on at most; more matching: call again (documented)
EFFECT_STATES = ("dead", "pending")  # dead: back to pending; pending: attempted now, not at its back-off
QUARANTINE_STATES = ("waiting", "redriven", "any")  # waiting: never redriven
STAGES = ("ingest", "worker", "projector", "effects", "fetcher")
_RELATIVE = re.compile(r"^([1-9][0-9]{0,6})(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}

Kind = Literal["effects", "quarantine"]


class BadFilter(ValueError):
    """A filter parameter that cannot be used; the message names it and says what it takes."""


@dataclass(frozen=True)
class Filter:
    """What a bulk action acts on. ``type`` is an effect's type (effects) or the stage that set a
    record aside (quarantine); ``since`` inclusive, ``until`` exclusive, on the effect's
    ``created_at`` or the record's ``quarantined_at``; ``reason`` a substring (quarantine only)."""

    kind: Kind
    state: str
    gateway: str | None = None
    type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    reason: str | None = None
    limit: int = MOST_PER_CALL

    def describe(self) -> str:
        """One line for the audit row's target: the filter as given."""
        parts = [f"state={self.state}"]
        for name in ("gateway", "type", "reason"):
            if (value := getattr(self, name)) is not None:
                shown = "stage" if name == "type" and self.kind == "quarantine" else name
                parts.append(f"{shown}={value}")
        for name in ("since", "until"):
            if (when := getattr(self, name)) is not None:
                parts.append(f"{name}={when.astimezone(UTC).isoformat().replace('+00:00', 'Z')}")
        parts.append(f"limit={self.limit}")
        return " ".join(parts)


def parse_instant(name: str, text: str, now: datetime) -> datetime:
    """ISO 8601 with its zone (``2026-11-29T10:00:00Z``, ``…+01:00``) or an age (``90s``, ``15m``,
    ``2h``, ``7d``: that long before ``now``). A time without a zone is refused: which zone it meant
    is a guess."""
    if match := _RELATIVE.match(text):
        try:
            return now - timedelta(seconds=int(match.group(1)) * _UNIT_S[match.group(2)])
        except OverflowError:  # an age before year 1
            raise BadFilter(f"{name}: {text} is further back than any record") from None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise BadFilter(f"{name} must be ISO 8601 with a zone (2026-11-29T10:00:00Z) or an age "
                        "like 90s, 15m, 2h, 7d") from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise BadFilter(f"{name} must name its zone (Z or ±hh:mm): {text!r} has none")
    try:
        return when.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:00-05:00 is past the last UTC year
        raise BadFilter(f"{name}: {text} is out of range") from None


def _text(name: str, value: str | None, most: int = 200) -> str | None:
    if value is None or value == "":
        return None
    if "\x00" in value or len(value) > most:
        raise BadFilter(f"{name} must be at most {most} characters without NUL")
    return value


def parse_filter(kind: Kind, given: Mapping[str, str], now: datetime) -> Filter:
    """The filter from parameters as text (the API's query, the command's options)."""
    states = EFFECT_STATES if kind == "effects" else QUARANTINE_STATES
    state = given.get("state") or states[0]
    if state not in states:
        raise BadFilter(f"state must be one of {', '.join(states)}")
    gateway = _text("gateway", given.get("gateway"))
    if gateway is not None and registry.find(gateway) is None:
        raise BadFilter(f"unknown gateway {gateway!r}; known: {', '.join(registry.GATEWAYS)}")
    type_name = "type" if kind == "effects" else "stage"
    kind_of = _text(type_name, given.get(type_name))
    if kind == "quarantine" and kind_of is not None and kind_of not in STAGES:
        raise BadFilter(f"stage must be one of {', '.join(STAGES)}")
    since_text, until_text = _text("since", given.get("since")), _text("until", given.get("until"))
    since = parse_instant("since", since_text, now) if since_text else None
    until = parse_instant("until", until_text, now) if until_text else None
    if since is not None and until is not None and since >= until:
        raise BadFilter("since must be before until")
    raw_limit = given.get("limit") or str(MOST_PER_CALL)
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= MOST_PER_CALL:
        raise BadFilter(f"limit must be an integer from 1 to {MOST_PER_CALL} (the most one call acts on)")
    reason = _text("reason", given.get("reason")) if kind == "quarantine" else None
    return Filter(kind, state, gateway, kind_of, since, until, reason, int(raw_limit))


def dry_run_flag(text: str | None) -> bool:
    if text in (None, "", "false", "0"):
        return False
    if text in ("true", "1"):
        return True
    raise BadFilter("dry_run must be true or false")


EFFECTS_MATCH = """
SELECT dedupe_key, created_at FROM effects
 WHERE delivered_at IS NULL AND CASE $1::text WHEN 'dead' THEN dead_at IS NOT NULL ELSE dead_at IS NULL END
   AND ($2::text IS NULL OR gateway = $2) AND ($3::text IS NULL OR type = $3)
   AND ($4::timestamptz IS NULL OR created_at >= $4) AND ($5::timestamptz IS NULL OR created_at < $5)"""
QUARANTINE_MATCH = """
SELECT delivery_id, quarantined_at, redrives FROM quarantine
 WHERE CASE $1::text WHEN 'waiting' THEN redriven_at IS NULL WHEN 'redriven' THEN redriven_at IS NOT NULL
                     ELSE true END
   AND ($2::text IS NULL OR gateway = $2) AND ($3::text IS NULL OR stage = $3)
   AND ($4::timestamptz IS NULL OR quarantined_at >= $4) AND ($5::timestamptz IS NULL OR quarantined_at < $5)
   AND ($6::text IS NULL OR strpos(reason, $6) > 0)"""
COUNT = "SELECT count(*) FROM ({match}) m"
# one statement: the rows it picks are back to pending (or due now) together, or none are
# A pending row claimed by an effects process waits out its lease (next_attempt_at = the claim + the
# lease) while its request is in flight: made due now, another process would claim and send it
# again. So a pending row is made due now only when it waits longer than a lease, surely a back-off;
# one due within the lease is attempted by then anyway. A dead row is never claimed.
RETRY = f"""
UPDATE effects SET dead_at = NULL, next_attempt_at = now()
 WHERE dedupe_key IN (SELECT dedupe_key FROM ({EFFECTS_MATCH}) m ORDER BY created_at, dedupe_key LIMIT $6)
   AND delivered_at IS NULL
   AND (dead_at IS NOT NULL OR next_attempt_at > now() + make_interval(secs => $7))
RETURNING dedupe_key"""
PICK_QUARANTINED = f"""
SELECT delivery_id, redrives FROM ({QUARANTINE_MATCH}) m ORDER BY quarantined_at, delivery_id LIMIT $7"""


def _args(f: Filter) -> list[object]:
    common: list[object] = [f.state, f.gateway, f.type, f.since, f.until]
    return [*common, f.reason] if f.kind == "quarantine" else common


@dataclass(frozen=True)
class Outcome:
    """What a bulk call did (or, dry, would do): ``matched`` rows now, ``acted`` on (at most the limit)."""

    action: str
    target: str
    matched: int
    acted: int
    refused: int
    dry_run: bool
    result: str

    def body(self) -> dict[str, object]:
        return {"action": self.action, "target": self.target, "matched": self.matched, "acted": self.acted,
                "refused": self.refused, "dry_run": self.dry_run, "result": self.result,
                "most_per_call": MOST_PER_CALL}


async def count(conn: Conn, f: Filter) -> int:
    match = EFFECTS_MATCH if f.kind == "effects" else QUARANTINE_MATCH
    return int(await conn.fetchval(COUNT.format(match=match), *_args(f)))


def _dry(action: str, f: Filter, matched: int) -> Outcome:
    would = min(matched, f.limit)
    return Outcome(action, f.describe(), matched, 0, 0, True,
                   f"dry run: {matched} match, a call would act on {would}")


async def retry_effects(conn: Conn, f: Filter, actor: str, dry_run: bool, lease_s: float) -> Outcome:
    """Every effect the filter matches (at most ``f.limit``, oldest first) due now: a dead one back
    to pending, a pending one attempted without waiting for its back-off (one that waits no longer
    than ``lease_s``, ORDERLY_EFFECTS_LEASE_S, may be in flight and is left: see RETRY). One audit row."""
    matched = await count(conn, f)
    if dry_run:
        return _dry("effects.retry.bulk", f, matched)
    keys = [r["dedupe_key"] for r in await conn.fetch(RETRY, *_args(f), f.limit, lease_s)]
    verb = "back to pending" if f.state == "dead" else "due now"
    result = f"{len(keys)} of {matched} matched {verb}"
    await actions.audited(conn, actor, "effects.retry.bulk", f.describe(), result)
    return Outcome("effects.retry.bulk", f.describe(), matched, len(keys), 0, False, result)


async def redrive_quarantined(conn: Conn, producer: KeyedProducer | None, n: TopicNames, f: Filter, now_ms: int,
                              actor: str, dry_run: bool) -> Outcome:
    """Every record the filter matches (at most ``f.limit``, oldest first) appended again, as a
    single redrive does it; one its adapter still refuses is counted and left. Kafka lost midway
    stops the call: the audit row says how far it got. One audit row."""
    matched = await count(conn, f)
    if dry_run:
        return _dry("quarantine.redrive.bulk", f, matched)
    if producer is None:  # the caller asked for no producer: only a dry run can be answered then
        raise actions.ActionRefused("Kafka is not reachable, nothing was done", 503)
    ids = [(r["delivery_id"], r["redrives"]) for r in await conn.fetch(PICK_QUARANTINED, *_args(f), f.limit)]
    done, refused, first_refusal, lost = 0, 0, "", ""
    for delivery_id, redrives in ids:
        try:
            # a migration made the locking read stale: it failed before the append, rolled back
            await prepared_anew(partial(actions.redrive_one, conn, producer, n, delivery_id, now_ms, redrives))
            done += 1
        except actions.ActionRefused as exc:
            if exc.status == 503:
                lost = str(exc)
                break
            refused += 1
            first_refusal = first_refusal or str(exc)
    result = f"{done} of {matched} matched redriven"
    if refused:
        result += f"; {refused} refused (first: {first_refusal})"
    if lost:
        result += f"; stopped after {done + refused} of {len(ids)}: {lost}"
    await actions.audited(conn, actor, "quarantine.redrive.bulk", f.describe(), result)
    if lost:
        raise actions.ActionRefused(result, 503)
    return Outcome("quarantine.redrive.bulk", f.describe(), matched, done, refused, False, result)
