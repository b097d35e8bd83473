"""`orderly simulate`: the gateway simulator as a tool, against any Orderly ingest (I/O shell)."""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from typing import TextIO

import aiohttp
import orjson
from aiohttp import web

from app.gateways import registry
from app.settings import Settings
from app.simulator import api, lifecycles, plugins
from app.simulator.deliver import Chaos, deliver


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gateway", choices=[*registry.GATEWAYS, "all"], default="all")
    parser.add_argument("--target", help="the ingest's base URL, e.g. http://127.0.0.1:8080 (required unless "
                                         "--check, where it sends the checked histories through that stack)")
    parser.add_argument("--check", action="store_true",
                        help="run seeded histories through the pure core (or, with --target, the stack) and compare "
                             "them with an oracle built from the gateway documents; exit 0 only if all match")
    parser.add_argument("--histories", type=int, default=1000, help="with --check: histories per gateway")
    parser.add_argument("--tag", default=None,
                        help="with --check --target: prefix of the resource ids (default: from the clock)")
    parser.add_argument("--count", type=int, default=50, help="resources per kind")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--api-port", type=int, default=0, help="serve the gateways' GET APIs here (0 = not)")
    parser.add_argument("--fetch-api", choices=api.FETCH_APIS, default="truth",
                        help="how the served GET APIs answer: truth (the final state), 404 (never), stale (one event "
                             "behind)")
    parser.add_argument("--time-scale", type=float, default=1 / 40, help="gateway ms -> real ms")


async def _simulate(settings: Settings, args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    truth = lifecycles.Truth()
    events: list[lifecycles.Emitted] = []
    for name in registry.GATEWAYS:  # in the registry's order: the seeded draws, so the events, follow it
        found = plugins.simulator(name)
        if name not in settings.secrets:
            continue  # not enabled (ORDERLY_GATEWAYS): the target does not serve it, nothing here can sign for it
        if args.gateway in (name, "all") and found is not None and found.lifecycles is not None:
            events += found.lifecycles(rng, args.count, truth)
    runner = None
    if args.api_port:
        runner = web.AppRunner(api.build(truth, events, args.fetch_api), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", args.api_port).start()
    try:
        async with aiohttp.ClientSession() as http:
            for dep, body in truth.correlations.items():  # the merchant's create-deposit responses
                async with http.put(f"{args.target}/correlations/pg/deposits/{dep}", data=orjson.dumps(body),
                                    headers={"Authorization": f"Bearer {settings.api_token.reveal()}"}) as resp:
                    if resp.status != 200:
                        print(f"correlation {dep}: HTTP {resp.status}")
        stats = await deliver(args.target, events, {g: s.reveal()[0] for g, s in settings.secrets.items()}, rng,
                              Chaos(time_scale=args.time_scale))
    finally:
        if runner is not None:
            await runner.cleanup()
    for gateway in sorted(stats.attempts):
        print(f"{gateway}: {stats.attempts[gateway]} attempts, {stats.accepted[gateway]} accepted, "
              f"{stats.retries[gateway]} retried, {stats.duplicates[gateway]} duplicated, "
              f"{stats.given_up[gateway]} given up")
    return 1 if sum(stats.given_up.values()) else 0


def check_command(settings: Settings, args: argparse.Namespace, out: TextIO | None = None) -> int:
    """`orderly simulate --check [--gateway G] --histories N --seed S [--target URL [--tag T]]`: through
    the pure core (app/simulator/check.py) or, with ``--target``, a running stack (app/simulator/stack.py)."""
    # Imported here, not at the top: every `orderly` command imports this module to build its parser
    # (app/cli.py), and only --check needs the core's planner, asyncpg and a Kafka producer.
    from app.simulator import check, stack

    out = out or sys.stdout
    checked = plugins.simulated()
    gateways = sorted(checked) if args.gateway == "all" else [args.gateway]
    if any(g not in checked for g in gateways):
        print(f"orderly simulate --check: no histories for {args.gateway!r}", file=out)
        return 2
    if args.target:
        tag = args.tag if args.tag is not None else f"t{int(time.time()) % 10**8}x"
        _, bad = stack.run(settings, args.target.rstrip("/"), gateways, args.histories, args.seed, tag, out)
    else:
        _, bad = check.run(gateways, args.histories, args.seed, out)
    return 0 if bad == 0 else 1


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.check:
        return check_command(settings, args)
    if not args.target:
        raise SystemExit("orderly simulate: --target is required (or --check)")
    return asyncio.run(_simulate(settings, args))
