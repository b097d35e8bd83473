"""Operator commands on the quarantine: `orderly quarantine list|show|redrive` (I/O shell).

They read through projections/quarantine.py's queries and act through ``redrive`` here, which an
admin API would share, against the namespace the environment names.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from app.gateways import registry
from app.producer import KeyedProducer
from app.settings import Settings
from projections import quarantine
from projections.migrate import quote_ident
from topics.catalog import TopicNames, names
from topics.records import (
    H_DELIVERY_ID,
    H_REASON,
    H_RECEIVED_AT,
    H_RESOURCE,
    H_SOURCE_KEY,
    H_STAGE,
    H_TOPIC,
)


class RedriveError(ValueError):
    """The record cannot be redriven (unknown, or nowhere to append it); the message says why."""


@dataclass(frozen=True)
class Redriven:
    delivery_id: str  # the new delivery's id
    topic: str
    key: bytes


async def redrive(conn: asyncpg.Connection, producer: KeyedProducer, n: TopicNames, delivery_id: str,
                  now_ms: int) -> Redriven:
    """Append a quarantined record's body again where it was set aside from, and mark it."""
    stored = await quarantine.one(conn, delivery_id)
    if stored is None:
        raise RedriveError(f"no quarantined record {delivery_id!r}")
    body: bytes = stored["body"]
    original = {k: v for k, v in stored["headers"]}
    new_id = f"{delivery_id}~r{stored['redrives'] + 1}"
    topic = stored["topic"] or n.raw
    if stored["stage"] in ("ingest", "worker") or topic == n.raw:
        gateway = stored["gateway"]
        found = registry.find(gateway or "")
        adapter = found.adapter if found is not None else None
        if original.get("record") == "correlation":
            key = stored["record_key"] or f"pg:{stored['resource_id']}".encode()
        elif adapter is None:
            raise RedriveError(f"{delivery_id}: no gateway recorded, so nowhere to route it")
        else:
            route = adapter.route(body)
            if route.resource_key is None:
                raise RedriveError(f"{delivery_id}: still refused by the {gateway} adapter: {route.quarantine_reason}")
            key = route.resource_key.encode()
        headers = [(k, v.encode()) for k, v in original.items()
                   if k not in (H_STAGE, H_REASON, H_RESOURCE, H_TOPIC, H_SOURCE_KEY, H_DELIVERY_ID)]
        headers += [(H_DELIVERY_ID, new_id.encode())]
        if H_RECEIVED_AT not in original:
            headers.append((H_RECEIVED_AT, str(now_ms).encode()))
        target = n.raw
    else:
        key = stored["record_key"] or b""
        headers, target = [], topic
    await producer.send_and_wait(target, key, body, headers)
    await conn.execute(quarantine.MARK_REDRIVEN, delivery_id)
    return Redriven(new_id, target, key)


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
            done = await redrive(conn, producer, names(settings.namespace), args.delivery_id,
                                 int(time.time() * 1000))
        except RedriveError as exc:
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
