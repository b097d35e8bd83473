"""Operator commands on the quarantine: `orderly quarantine list|show|redrive` (I/O shell).

They read and act through projections/quarantine.py, the same queries and actions an admin API
would use, against the namespace the environment names.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import asyncpg
import orjson

from app.producer import KeyedProducer
from app.settings import Settings
from projections import quarantine
from projections.migrate import quote_ident
from topics.catalog import names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="set-aside records, newest first")
    listing.add_argument("--stage", help="ingest, worker, projector, effects or fetcher")
    listing.add_argument("--gateway")
    listing.add_argument("--limit", type=int, default=50)
    show = actions.add_parser("show", help="one record with its headers and body")
    show.add_argument("delivery_id")
    redrive = actions.add_parser("redrive", help="append the record's body again where it was set aside from")
    redrive.add_argument("delivery_id")


async def _connect(settings: Settings) -> asyncpg.Connection:
    return await asyncpg.connect(settings.postgres_dsn,
                                 server_settings={"search_path": quote_ident(settings.namespace)})


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


async def run(settings: Settings, args: argparse.Namespace) -> int:
    conn = await _connect(settings)
    try:
        if args.action == "list":
            rows = await quarantine.listing(conn, args.stage, args.gateway, args.limit)
            print(f"{'quarantined at':<25} {'stage':<9} {'gateway':<7} {'delivery id':<34} {'resource':<24} reason")
            for r in rows:
                redriven = f" (redriven {r['redrives']}x, last {_when(r['redriven_at'])})" if r["redrives"] else ""
                print(f"{_when(r['quarantined_at']):<25} {r['stage']:<9} {r['gateway'] or '-':<7} "
                      f"{r['delivery_id']:<34} {(r['resource_id'] or '-')[:24]:<24} {r['reason']}{redriven}")
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
            except orjson.JSONDecodeError:
                print(f"body ({len(body)} bytes, not JSON): {body[:2000]!r}")
            return 0
        producer = KeyedProducer(settings.kafka_bootstrap)
        await producer.start()
        try:
            done = await quarantine.redrive(conn, producer, names(settings.namespace), args.delivery_id,
                                            int(time.time() * 1000))
        except quarantine.RedriveError as exc:
            print(f"orderly quarantine: {exc}", file=sys.stderr)
            return 1
        finally:
            await producer.stop()
        print(f"redriven: {args.delivery_id} appended to {done.topic} as delivery {done.delivery_id}")
        return 0
    finally:
        await conn.close()


def main(settings: Settings, args: argparse.Namespace) -> int:
    return asyncio.run(run(settings, args))
