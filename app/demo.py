"""`orderly demo`: the main job end to end on the embedded stack (I/O shell).

Starts Kafka, PostgreSQL and every Orderly process, lets the gateway simulator drive pg, card and
paymos resources with out-of-order, duplicated, first-attempt-failing and outage-interrupted
deliveries (the ingest is killed for a while in the middle), waits for the pipeline to drain, and
compares every read-model row and every user balance with the gateway's truth. Exit 0 only if all
match.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
import orjson
from aiohttp import web

from app.settings import Settings
from app.simulator import api, lifecycles
from app.simulator.deliver import Stats, deliver
from app.stack.process import free_port
from app.supervisor import Stack, supervise_until_stopped
from projections.migrate import quote_ident


@dataclass
class Size:
    deposits: int = 200
    withdrawals: int = 60
    payments: int = 200
    paymos_per_kind: int = 80


async def _correlate(url: str, token: str, truth: lifecycles.Truth, rng: random.Random) -> None:
    """The merchant stores each deposit's mapping when its create call returns: usually before the
    first webhook, sometimes after (those webhooks are parked until it arrives)."""
    async with aiohttp.ClientSession() as http:
        async def one(dep: str, body: dict[str, str]) -> None:
            await asyncio.sleep(rng.choice([0.0, 0.0, 0.0, 0.0, rng.random() * 3]))
            for _ in range(30):
                try:
                    async with http.put(f"{url}/correlations/pg/deposits/{dep}", data=orjson.dumps(body),
                                        headers={"Authorization": f"Bearer {token}"}) as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.5)  # the ingest may be down: the merchant retries too
        await asyncio.gather(*(one(dep, body) for dep, body in truth.correlations.items()))


async def compare(settings: Settings, truth: lifecycles.Truth) -> dict[str, dict[str, int]]:
    conn = await asyncpg.connect(settings.postgres_dsn,
                                 server_settings={"search_path": quote_ident(settings.namespace)})
    try:
        report: dict[str, dict[str, int]] = {}

        def tally(name: str, want: dict[str, Any], have: dict[str, Any]) -> None:
            report[name] = {"resources": len(want), "match": sum(1 for k, v in want.items() if have.get(k) == v)}

        tally("pg deposits", truth.pg_deposits,
              {r[0]: r[1] for r in await conn.fetch("SELECT pg_deposit_id, status FROM pg_deposits")})
        tally("pg withdrawals", truth.pg_withdrawals,
              {r[0]: (r[1], r[2], r[3]) for r in await conn.fetch(
                  "SELECT pg_withdrawal_id, status, filled_minor, remaining_minor FROM pg_withdrawals")})
        balances = {r[0]: r[1] for r in await conn.fetch("SELECT user_id, balance_minor FROM user_balances")}
        tally("user balances", truth.balances, {u: balances.get(u, 0) for u in truth.balances})
        tally("card payments",
              {k: (v["state"], v["captured_minor"], v["refunded_minor"]) for k, v in truth.card.items()},
              {r[0]: (r[1], r[2], r[3]) for r in await conn.fetch(
                  "SELECT payment_ref, state, captured_minor, refunded_minor FROM card_payments")})
        paymos: dict[str, str] = {}
        for table in ("paymos_invoices", "paymos_withdrawals", "paymos_channel_deposits"):
            paymos.update({r[0]: r[1] for r in await conn.fetch(f"SELECT id, status FROM {table}")})
        tally("paymos resources", truth.paymos, paymos)
        outcomes = {f"{r[0]} {r[1]}": r[2] for r in await conn.fetch(
            "SELECT gateway, outcome, count(*) FROM webhook_events GROUP BY 1, 2")}
        report["_outcomes"] = outcomes
        report["_effects"] = {r[0]: r[1] for r in await conn.fetch(
            "SELECT gateway, count(*) FROM effects GROUP BY 1")}
        return report
    finally:
        await conn.close()


def _print(report: dict[str, dict[str, int]], stats: Stats, elapsed: float) -> bool:
    print(f"\nOrderly demo: {elapsed:.0f} s\n")
    print(f"{'gateway':<8}{'deliveries':>11}{'accepted':>10}{'retries':>9}{'dup sent':>9}"
          f"{'applied':>9}{'stale':>7}{'dup':>6}{'parked→':>9}{'synced':>8}{'effects':>9}")
    outcomes, effects = report["_outcomes"], report["_effects"]
    for gw in ("pg", "card", "paymos"):
        def n(outcome: str, gw: str = gw) -> int:
            return outcomes.get(f"{gw} {outcome}", 0)
        print(f"{gw:<8}{stats.attempts[gw]:>11}{stats.accepted[gw]:>10}{stats.retries[gw]:>9}"
              f"{stats.duplicates[gw]:>9}{n('applied'):>9}{n('stale'):>7}{n('duplicate'):>6}"
              f"{n('unparked') + n('parked'):>9}{n('synced'):>8}{effects.get(gw, 0):>9}")
    print(f"\n{'read model vs gateway truth':<30}{'resources':>10}{'match':>8}")
    ok = True
    for name, r in report.items():
        if name.startswith("_"):
            continue
        ok &= r["match"] == r["resources"]
        print(f"{name:<30}{r['resources']:>10}{r['match']:>8}  {'OK' if r['match'] == r['resources'] else 'MISMATCH'}")
    print("\nall read models match the gateways' truth" if ok else "\nMISMATCH: see the rows above")
    return ok


async def _run(settings: Settings, stack: Stack, events: list[lifecycles.Emitted], truth: lifecycles.Truth,
               rng: random.Random) -> int:
    secrets = {g: s[0] for g, s in settings.secrets.items()}
    started = time.monotonic()
    done = asyncio.Event()

    async def supervise() -> None:
        while not done.is_set():
            stack.supervise_once()
            await asyncio.sleep(0.2)

    async def outage() -> None:
        await asyncio.sleep(2.0)
        ingest = next(c for c in stack.children if c.name == "ingest")
        if ingest.proc is not None:
            os.kill(ingest.proc.pid, signal.SIGKILL)  # the endpoint goes down mid-run; the supervisor brings it back
            print("ingest killed for an outage; deliveries fail and are retried", flush=True)

    supervisor = asyncio.create_task(supervise())
    try:
        results = await asyncio.gather(deliver(stack.ingest_url, events, secrets, rng),
                                       _correlate(stack.ingest_url, settings.api_token, truth, rng), outage())
        stats = results[0]
        deadline = time.monotonic() + 180
        report = await compare(settings, truth)
        while time.monotonic() < deadline and not all(
                r["match"] == r["resources"] for k, r in report.items() if not k.startswith("_")):
            await asyncio.sleep(1.0)
            report = await compare(settings, truth)
    finally:
        done.set()
        await supervisor
    return 0 if _print(report, stats, time.monotonic() - started) else 1


MERCHANT_PATH = "/merchant/effects"


async def _merchant_accepts(request: web.Request) -> web.Response:
    """The demo merchant takes every effect, so the console shows them delivered."""
    await request.read()
    return web.Response(status=204)


def run_demo(settings: Settings, size: Size | None = None, seed: int = 7, keep: bool = False) -> int:
    size = size or Size()
    api_port = free_port()
    settings = settings.with_overrides(card_api_url=f"http://127.0.0.1:{api_port}",
                                       pg_api_url=f"http://127.0.0.1:{api_port}",
                                       effects_url=f"http://127.0.0.1:{api_port}{MERCHANT_PATH}",
                                       fetch_parked_after_s=3.0, fetch_interval_s=1.0,
                                       namespace=f"demo{int(time.time())}")
    rng = random.Random(seed)  # seeded: the same run every time
    truth = lifecycles.Truth()
    events = (lifecycles.pg(rng, size.deposits, size.withdrawals, truth) + lifecycles.card(rng, size.payments, truth)
              + lifecycles.paymos(rng, size.paymos_per_kind, truth))
    stack = Stack(settings)

    async def main() -> int:
        gateways = api.build(truth, events)  # the gateways' GET APIs, and the merchant's effects endpoint
        gateways.router.add_post(MERCHANT_PATH, _merchant_accepts)
        runner = web.AppRunner(gateways, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", api_port).start()
        try:
            return await _run(settings, stack, events, truth, rng)
        finally:
            await runner.cleanup()

    try:
        stack.start()
        code = asyncio.run(main())
        if keep:
            _keep_up(stack, settings)
        return code
    finally:
        stack.stop()


def _keep_up(stack: Stack, settings: Settings) -> None:
    """`orderly demo --keep`: the stack and the console stay up on the demo's data until Ctrl-C."""
    print(f"\nthe stack stays up on the demo's data (namespace {settings.namespace}); Ctrl-C stops it\n"
          f"  console:     {stack.admin_url}/  (admin token: {settings.admin_token})\n"
          f"  admin API:   curl -H 'Authorization: Bearer {settings.admin_token}' {stack.admin_url}/api/overview\n"
          f"  ingest:      {stack.ingest_url}\n"
          f"  commands:    orderly parked | gaps | inspect GATEWAY ID | effects list (found via .orderly/stack.json)",
          flush=True)
    supervise_until_stopped(stack)
