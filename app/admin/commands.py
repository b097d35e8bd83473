"""Operator commands: `orderly inspect | parked | gaps | quarantine | effects list|retry` (I/O shell).

They print what the admin API answers, from the same queries (app/admin/queries.py) and actions
(app/admin/actions.py, audited as ``cli:<user>``), against the namespace the environment names —
or, next to a running `orderly dev`, the one its ``.orderly/stack.json`` describes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson

from app.admin import actions, bulk, display, queries, timeline
from app.kafka_client import client_options
from app.producer import KeyedProducer
from app.settings import Settings
from app.waits import within
from projections import quarantine
from projections.migrate import quote_ident
from topics.catalog import names


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in this environment (a container): still audited
        return "cli:unknown"


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return display.zoned(value)  # ISO 8601 in UTC with its zone
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return "-" if value is None else str(value)


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, int]]) -> None:
    """Rows as fixed-width columns: (key, heading, width); the last column is not cut."""
    print(" ".join(f"{h:<{w}}" for _, h, w in columns).rstrip())
    for row in rows:
        cells = []
        for i, (key, _, width) in enumerate(columns):
            text = _when(row.get(key)) if row.get(key) is not None else "-"
            cells.append(text if i == len(columns) - 1 else f"{text[:width]:<{width}}")
        print(" ".join(cells))


def _json(rows: list[dict[str, Any]]) -> int:
    """A listing as the admin API answers it: ``{"items": [...]}``, raw integers and ISO 8601 times."""
    print(queries.dumps({"items": rows}).decode())
    return 0


async def _connect(settings: Settings) -> asyncpg.Connection:
    return await asyncpg.connect(settings.postgres_dsn.reveal(),
                                 server_settings={"search_path": quote_ident(settings.namespace)})


async def _with_producer(settings: Settings, act: Callable[[KeyedProducer], Awaitable[int]]) -> int:
    producer = KeyedProducer(settings.kafka_bootstrap, request_timeout_ms=10_000, **client_options(settings))
    try:
        await within(producer.start(), actions.APPEND_DEADLINE_S)
    except Exception as exc:  # the broker away: nothing was done, and no traceback
        with contextlib.suppress(Exception):
            await producer.stop()
        raise actions.ActionRefused(f"Kafka at {settings.kafka_bootstrap} is not reachable "
                                    f"({type(exc).__name__}): nothing was done", 503) from exc
    try:
        return await act(producer)
    finally:
        await producer.stop()


async def inspect(settings: Settings, args: argparse.Namespace) -> int:
    conn = await _connect(settings)
    try:
        found = await queries.resource(conn, args.gateway, args.resource_id, args.order)
    finally:
        await conn.close()
    if found is None:
        print(f"orderly inspect: no {args.gateway} resource {args.resource_id!r}", file=sys.stderr)
        return 1
    if args.json:
        print(queries.dumps(found).decode())
        return 0
    state = found["state"] or {}
    status = state.get("status") or state.get("state") or "-"
    print(f"{args.gateway}:{args.resource_id}  {state.get('kind', 'no state row')}  status={status}  "
          f"parked={found['parked']}  late={found['late']}  order={found['order']}")
    money = display.amounts(state)
    for key, value in state.items():
        if key not in ("kind", "snapshot", "payload"):
            shown = _when(value) if hasattr(value, "isoformat") else value
            print(f"  {key}: {shown} ({money[key]})" if key in money else f"  {key}: {shown}")
    print()
    rows = [{**d, "effects": ", ".join(f"{e['type']}({e['status']})" for e in d["effects"]) or "-",
             "gw": f"{d['gateway_position'] or '-'}{' late' if d['late'] else ''}",
             "amount": display.delivery_amount(d.get("payload")) or "-"}
            for d in found["timeline"]]
    _table(rows, [("arrival", "arr", 3), ("gw", "gw", 7), ("received_at", "received at", 20),
                  ("gateway_time", "gateway time", 24), ("version", "ver", 4), ("sequence", "seq", 6),
                  ("event_type", "event", 22), ("outcome", "outcome", 11), ("effects", "effects", 30),
                  ("amount", "amount", 14), ("why", "why", 0)])
    return 0


async def parked(settings: Settings, args: argparse.Namespace) -> int:
    conn = await _connect(settings)
    try:
        rows = await queries.parked(conn, args.limit)
    finally:
        await conn.close()
    if args.json:
        return _json(rows)
    _table([{**r, "resource": f"{r['gateway']}:{r['resource_id']}"} for r in rows],
           [("parked_since", "parked since", 25), ("resource", "resource", 36), ("deliveries", "parked", 6),
            ("why", "why", 0)])
    print(f"{len(rows)} resource(s) holding parked deliveries")
    return 0


async def gaps(settings: Settings, args: argparse.Namespace) -> int:
    conn = await _connect(settings)
    try:
        rows = await queries.gaps(conn, args.limit)
    finally:
        await conn.close()
    if args.json:
        return _json(rows)
    _table([{**r, "range": f"{r['start_seq']}-{r['end_seq']}"} for r in rows],
           [("range", "sequences", 24), ("missing", "missing", 8), ("first_seen_at", "open since", 25),
            ("backfill", "backfill", 0)])
    print(f"{len(rows)} open gap(s)")
    return 0


async def quarantined(settings: Settings, args: argparse.Namespace) -> int:
    conn = await _connect(settings)
    try:
        if args.action == "list":
            rows = await quarantine.listing(conn, args.stage, args.gateway, args.limit)
            if args.json:
                return _json(rows)
            _table([{**r, "resource_id": r["resource_id"] or "-",
                     "redriven": f"{r['redrives']}x" if r["redrives"] else ""} for r in rows],
                   [("quarantined_at", "quarantined at", 25), ("stage", "stage", 9), ("gateway", "gateway", 7),
                    ("delivery_id", "delivery id", 34), ("resource_id", "resource", 24), ("redriven", "redriven", 8),
                    ("reason", "reason", 0)])
            print(f"{len(rows)} record(s)")
            return 0
        if args.action == "show":
            found = await quarantine.one(conn, args.delivery_id)
            if found is None:
                print(f"orderly quarantine: no record {args.delivery_id!r}", file=sys.stderr)
                return 1
            body = found.pop("body")
            for key, value in found.items():
                print(f"{key}: {_when(value) if hasattr(value, 'isoformat') else value}")
            try:
                print("body:", orjson.dumps(orjson.loads(body), option=orjson.OPT_INDENT_2).decode())
            except (orjson.JSONDecodeError, TypeError):  # TypeError: nested past what orjson writes
                print(f"body ({len(body)} bytes, not JSON or too deep to indent): {bytes(body)[:2000]!r}")
            return 0

        if args.delivery_id is None:
            return await _refusable("quarantine", _bulk_redrive(settings, conn, args))
        if args.dry_run:
            print("orderly quarantine redrive: --dry-run counts what a filter matches; name no delivery id",
                  file=sys.stderr)
            return 2

        async def act(producer: KeyedProducer) -> int:
            done = await actions.redrive(conn, producer, names(settings.namespace), args.delivery_id,
                                         int(time.time() * 1000), _actor())
            print(f"redriven: {args.delivery_id} {done.result}")
            return 0

        return await _refusable("quarantine", _with_producer(settings, act))
    finally:
        await conn.close()


async def effects(settings: Settings, args: argparse.Namespace) -> int:
    conn = await _connect(settings)
    try:
        if args.action == "list":
            rows = await queries.effects(conn, args.state, args.limit)
            if args.json:
                return _json(rows)
            _table(rows, [("created_at", "created at", 25), ("dedupe_key", "dedupe key", 44), ("attempts", "tries", 5),
                          ("status", "state", 9), ("last_error", "last error", 0)])
            print(f"{len(rows)} {args.state} effect(s)")
            return 0

        if args.dedupe_key is None:
            return await _refusable("effects", _bulk_retry(settings, conn, args))
        if args.dry_run:
            print("orderly effects retry: --dry-run counts what a filter matches; name no dedupe key", file=sys.stderr)
            return 2

        async def retry() -> int:
            done = await actions.retry_effect(conn, args.dedupe_key, _actor())
            print(f"retry: {done.target} {done.result}")
            return 0

        return await _refusable("effects", retry())
    finally:
        await conn.close()


def _filter(kind: bulk.Kind, args: argparse.Namespace) -> bulk.Filter:
    given = {name: str(value) for name in ("gateway", "type", "stage", "state", "since", "until", "reason", "limit")
             if (value := getattr(args, name, None)) is not None}
    try:
        return bulk.parse_filter(kind, given, datetime.now(UTC))
    except bulk.BadFilter as exc:
        raise actions.ActionRefused(str(exc), 400) from None


def _outcome(done: bulk.Outcome, as_json: bool) -> int:
    print(queries.dumps(done.body()).decode() if as_json else f"{done.action} {done.target}: {done.result}")
    return 0


async def _bulk_retry(settings: Settings, conn: asyncpg.Connection, args: argparse.Namespace) -> int:
    return _outcome(await bulk.retry_effects(conn, _filter("effects", args), _actor(), args.dry_run,
                                             settings.effects_lease_s), args.json)


async def _bulk_redrive(settings: Settings, conn: asyncpg.Connection, args: argparse.Namespace) -> int:
    found = _filter("quarantine", args)
    if args.dry_run:  # a count needs no broker
        return _outcome(await bulk.redrive_quarantined(conn, None, names(settings.namespace), found, 0, _actor(),
                                                       True), args.json)

    async def act(producer: KeyedProducer) -> int:
        return _outcome(await bulk.redrive_quarantined(conn, producer, names(settings.namespace), found,
                                                       int(time.time() * 1000), _actor(), False), args.json)

    return await _with_producer(settings, act)


async def _refusable(command: str, action: Awaitable[int]) -> int:
    try:
        return await action
    except actions.ActionRefused as exc:
        print(f"orderly {command}: {exc}", file=sys.stderr)
        return 1


def add_inspect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("gateway", help="pg, card or paymos")
    parser.add_argument("resource_id", help="the gateway's id of the resource")
    parser.add_argument("--json", action="store_true", help="print the admin API's JSON instead of a table")
    parser.add_argument("--order", choices=timeline.ORDERS, default="arrival",
                        help="the timeline in arrival order (default) or the gateway's; `late` marks a delivery "
                             "that arrived after one the gateway placed later")


def add_limit(parser: argparse.ArgumentParser, default: int = 200) -> None:
    """A listing's options: how many rows, and ``--json`` (the admin API's answer, for scripts)."""
    parser.add_argument("--limit", type=int, default=default, help=f"rows at most (default {default})")
    parser.add_argument("--json", action="store_true", help='print {"items": [...]} as the admin API answers')


def add_bulk(parser: argparse.ArgumentParser, kind: bulk.Kind) -> None:
    """The filter of a bulk action (used when no single id is given)."""
    states = bulk.EFFECT_STATES if kind == "effects" else bulk.QUARANTINE_STATES
    parser.add_argument("--gateway", help="only this gateway")
    if kind == "effects":
        parser.add_argument("--type", help="only effects of this type (e.g. credit_user)")
    else:
        parser.add_argument("--stage", choices=bulk.STAGES, help="only records this stage set aside")
        parser.add_argument("--reason", help="only records whose reason contains this text")
    parser.add_argument("--state", choices=states, default=states[0], help=f"default: {states[0]}")
    parser.add_argument("--since", help="from this time (ISO 8601 with its zone) or age (90s, 15m, 2h, 7d)")
    parser.add_argument("--until", help="before this time (ISO 8601 with its zone) or age")
    parser.add_argument("--limit", type=int, default=bulk.MOST_PER_CALL,
                        help=f"act on at most this many, oldest first (at most {bulk.MOST_PER_CALL} a call)")
    parser.add_argument("--dry-run", action="store_true", help="print how many match; change nothing")
    parser.add_argument("--json", action="store_true", help="print the outcome as the admin API answers it")


def add_quarantine(parser: argparse.ArgumentParser) -> None:
    found = parser.add_subparsers(dest="action", required=True, metavar="{list,show,redrive}")
    listing = found.add_parser("list", help="set-aside records, newest first",
                               description="Records set aside by any stage, newest first.")
    listing.add_argument("--stage", help="ingest, worker, projector, effects or fetcher")
    listing.add_argument("--gateway", help="only this gateway")
    add_limit(listing, 50)
    show = found.add_parser("show", help="one record with its headers and body",
                            description="One set-aside record with its headers and body.")
    show.add_argument("delivery_id")
    redrive = found.add_parser("redrive", help="append a record's body (or every one a filter matches) again",
                               description="Append the stored body again where it was set aside from (after a "
                                           "fix); the outcome shows in the resource's timeline. Audited. Without "
                                           "a delivery id: every record the filter matches (bulk, audited once).")
    redrive.add_argument("delivery_id", nargs="?", help="one record; omit it to act by filter")
    add_bulk(redrive, "quarantine")


def add_effects(parser: argparse.ArgumentParser) -> None:
    found = parser.add_subparsers(dest="action", required=False, metavar="{list,retry}")
    listing = found.add_parser("list", help="effects by delivery state",
                               description="Effects by delivery state, newest first, with attempts and last error.")
    listing.add_argument("--state", choices=queries.EFFECT_STATES, default="dead", help="default: dead")
    add_limit(listing, 100)
    retry = found.add_parser("retry", help="a dead effect (or every one a filter matches) back to pending",
                             description="A dead effect back to pending: the effects process attempts it at once. "
                                         "Audited. Without a dedupe key: every effect the filter matches (bulk, "
                                         "audited once).")
    retry.add_argument("dedupe_key", nargs="?", help="one effect; omit it to act by filter")
    add_bulk(retry, "effects")


def main(run: Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]], settings: Settings,
         args: argparse.Namespace) -> int:
    return asyncio.run(run(settings, args))
