"""`orderly demo`: the main job end to end on the embedded stack (I/O shell).

Starts Kafka, PostgreSQL and every Orderly process, lets the gateway simulator drive every simulated
gateway's resources (pg, card, paymos, stripe, adyen: each simulator declaration's ``demo``) with
out-of-order, duplicated, first-attempt-failing and outage-interrupted deliveries (the ingest is
killed for a while in the middle), waits for the pipeline to drain, and compares every read-model
row and every user balance with what the gateways' documents say it must hold (each declaration's
``demo_tables``, computed from the generated lifecycles, never from app/core) and with the
gateway's truth.

It runs one pass per ``--fetch-api`` mode (default ``404,truth``), each in a fresh namespace with
the same seeded lifecycles and deliveries. With ``404`` the gateways' GET APIs never answer, so a
card payment left parked is never synced from a fetch: the read models are the reducers' work alone
and must still reach the truth. With ``truth`` the fetcher may sync parked payments (the table says
how many); ``stale`` answers one event behind, and a payment synced from it must hold that answer, as
the playbook says a synced event is the new base. Exit 0 only if every pass matched.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import asyncpg
import orjson
from aiohttp import web

from app.gateways import registry
from app.settings import Settings
from app.simulator import api, lifecycles, plugins
from app.simulator.deliver import Chaos, Stats, deliver
from app.simulator.expected import Fetched
from app.simulator.plugins import DemoInput
from app.stack import credentials
from app.stack.process import spare_port
from app.supervisor import Stack, supervise_until_stopped
from projections.migrate import quote_ident


@dataclass
class Size:
    """How many resources the demo simulates: each gateway simulator's ``demo_sizes``, times ``scale``."""

    scale: float = 1.0

    def of(self, simulator: plugins.GatewaySimulator) -> tuple[int, ...]:
        return tuple(max(1, int(n * self.scale)) for n in simulator.demo_sizes)


def demo_events(rng: random.Random, size: Size, truth: lifecycles.Truth) -> list[lifecycles.Emitted]:
    """Every simulated gateway's demo lifecycles, in the registry's order (the seeded draws follow it)."""
    events: list[lifecycles.Emitted] = []
    for name in plugins.simulated():
        found = plugins.simulator_of(name)
        if found.demo is not None:
            events += found.demo(rng, size.of(found), truth)
    return events


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


async def compare_expected(settings: Settings, events: list[lifecycles.Emitted], truth: lifecycles.Truth,
                           lost: frozenset[bytes], fetched: Sequence[Fetched]) -> dict[str, dict[str, int]]:
    """Every read model of each simulated gateway (its ``demo_tables``) against what the documents say
    it must hold after ``events`` (but the ``lost`` ones, which the gateway gave up on) and the
    ``fetched`` answers, and how many of its resources also hold the gateway's ``truth``."""
    conn = await asyncpg.connect(settings.postgres_dsn.reveal(),
                                 server_settings={"search_path": quote_ident(settings.namespace)})
    try:
        report: dict[str, dict[str, int]] = {}
        for name in plugins.simulated():
            found = plugins.simulator_of(name)
            run = DemoInput([e for e in events if e.gateway == name and e.body not in lost], truth.correlations,
                            fetched)
            for table in found.demo_tables:
                want, gateway_truth = table.expected(run), table.truth(truth)
                have = {}
                for record in await conn.fetch(table.query):
                    row = tuple(record)
                    have[row[0]] = row[1] if len(row) == 2 else row[1:]
                report[table.name] = {
                    "resources": len(want),
                    "match": sum(1 for k, v in want.items() if have.get(k, table.missing) == v),
                    "truth": sum(1 for k in want if have.get(k, table.missing) == gateway_truth.get(k))}
        outcomes = {f"{r[0]} {r[1]}": r[2] for r in await conn.fetch(
            "SELECT gateway, outcome, count(*) FROM webhook_events GROUP BY 1, 2")}
        report["_outcomes"] = outcomes
        report["_effects"] = {r[0]: r[1] for r in await conn.fetch(
            "SELECT gateway, count(*) FROM effects GROUP BY 1")}
        report["_fetched"] = {"card payments": await conn.fetchval(
            "SELECT count(DISTINCT payment_ref) FROM card_events WHERE source = 'fetch'")}
        return report
    finally:
        await conn.close()


def _matched(report: dict[str, dict[str, int]]) -> bool:
    return all(r["match"] == r["resources"] for k, r in report.items() if not k.startswith("_"))


@dataclass
class Pass:
    """One run of the simulator against the stack, with the gateways' GET APIs answering ``fetch_api``."""
    fetch_api: str
    ok: bool = False
    card_fetches: int = 0
    card_answered: int = 0  # card payments GET /payments/{ref} answered with 200
    synced_payments: int = 0  # card payments holding a synced event (the read model's count)
    pg_backfills: int = 0
    card_truth: tuple[int, int] = (0, 0)  # card payments at the gateway's final state, of all


def _print(report: dict[str, dict[str, int]], stats: Stats, elapsed: float, done: Pass) -> bool:
    print(f"\nOrderly demo, fetch API {done.fetch_api} ({FETCH_API_MEANS[done.fetch_api]}): {elapsed:.0f} s\n")
    print(f"{'gateway':<8}{'deliveries':>11}{'accepted':>10}{'retries':>9}{'dup sent':>9}"
          f"{'applied':>9}{'stale':>7}{'dup':>6}{'parked→':>9}{'synced':>8}{'effects':>9}")
    outcomes, effects = report["_outcomes"], report["_effects"]
    for gw in registry.GATEWAYS:
        if plugins.simulator(gw) is None:
            continue  # a gateway the simulator has no lifecycles for

        def n(outcome: str, gw: str = gw) -> int:
            return outcomes.get(f"{gw} {outcome}", 0)
        print(f"{gw:<8}{stats.attempts[gw]:>11}{stats.accepted[gw]:>10}{stats.retries[gw]:>9}"
              f"{stats.duplicates[gw]:>9}{n('applied'):>9}{n('stale'):>7}{n('duplicate'):>6}"
              f"{n('unparked') + n('parked'):>9}{n('synced'):>8}{effects.get(gw, 0):>9}")
    print(f"\n{'read model vs the documents':<30}{'resources':>10}{'match':>8}{'= truth':>9}")
    for name, r in report.items():
        if not name.startswith("_"):
            print(f"{name:<30}{r['resources']:>10}{r['match']:>8}{r['truth']:>9}"
                  f"  {'OK' if r['match'] == r['resources'] else 'MISMATCH'}")
    print(f"\nfetches: card GET /payments/{{ref}} {done.card_fetches} (answered 200 for {done.card_answered} "
          f"payments), pg GET /v1/pay/events {done.pg_backfills}; card payments synced: {done.synced_payments}")
    ok = _matched(report)
    print(f"\nall read models match what the documents expect with the fetch API {done.fetch_api}" if ok
          else "\nMISMATCH: see the rows above")
    return ok


async def _run(settings: Settings, stack: Stack, events: list[lifecycles.Emitted], truth: lifecycles.Truth,
               rng: random.Random, done: Pass, served: api.Served) -> int:
    secrets = {g: s.reveal()[0] for g, s in settings.secrets.items()}
    started = time.monotonic()
    finished = asyncio.Event()

    async def supervise() -> None:
        while not finished.is_set():
            stack.supervise_once()
            await asyncio.sleep(0.2)

    async def outage() -> None:
        await asyncio.sleep(OUTAGE_AT_S)
        ingest = next(c for c in stack.children if c.name == "ingest")
        if ingest.proc is not None:
            os.kill(ingest.proc.pid, signal.SIGKILL)  # the endpoint goes down mid-run; the supervisor brings it back
            print("ingest killed for an outage; deliveries fail and are retried", flush=True)

    async def check(stats: Stats) -> dict[str, dict[str, int]]:
        # recomputed every time: the fetcher may have been answered since the last look
        return await compare_expected(settings, events, truth, stats.lost, served.card_answers)

    supervisor = asyncio.create_task(supervise())
    try:
        chaos = Chaos(late=late_authorisations(events), late_s=LATE_S)
        results = await asyncio.gather(deliver(stack.ingest_url, events, secrets, rng, chaos),
                                       _correlate(stack.ingest_url, settings.api_token.reveal(), truth, rng), outage())
        stats = results[0]
        deadline = time.monotonic() + 180
        for settle in (0.0, settings.fetch_interval_s * 2):  # and again once a fetch under way has landed
            await asyncio.sleep(settle)
            report = await check(stats)
            while time.monotonic() < deadline and not _matched(report):
                await asyncio.sleep(1.0)
                report = await check(stats)
        done.card_fetches = served.count("card GET /payments/{ref}")
        done.card_answered = len({f.ref for f in served.card_answers})
        done.pg_backfills = served.count("pg GET /v1/pay/events")
        done.synced_payments = report["_fetched"]["card payments"]
        done.card_truth = report["card payments"]["truth"], report["card payments"]["resources"]
    finally:
        finished.set()
        await supervisor
    done.ok = _print(report, stats, time.monotonic() - started, done)
    return 0 if done.ok else 1


MERCHANT_PATH = "/merchant/effects"
OUTAGE_AT_S = 1.0  # while the card payments are still being delivered: some wait parked for seconds
FETCH_PARKED_AFTER_S = 2.0  # the playbook's 60 s, compressed like the gateways' retry schedule
# Every LATE_EVERY-th card payment's authorisation comes LATE_S late (a retry after days, compressed),
# so its captures wait parked past FETCH_PARKED_AFTER_S, whatever the outage's length on this
# machine: the truth pass has payments to fetch, the 404 pass waits for the authorisation.
LATE_EVERY = 10
LATE_S = 6.0

FETCH_API_MEANS = {"404": "every GET answers 404: the reducers alone",
                   "truth": "answers the gateway's final state",
                   "stale": "answers one event behind"}
DEFAULT_FETCH_APIS = ("404", "truth")  # the reducers alone first, then with the fetcher's help


def late_authorisations(events: list[lifecycles.Emitted]) -> frozenset[bytes]:
    """The first event (card's authorisation) of every LATE_EVERY-th resource of a gateway whose
    simulator says its first event may come late (``late_first``)."""
    first: dict[str, bytes] = {}
    late = {g for g in registry.GATEWAYS if (found := plugins.simulator(g)) is not None and found.late_first}
    for e in events:
        if e.gateway in late:
            first.setdefault(e.resource, e.body)
    return frozenset(body for n, body in enumerate(first.values()) if n % LATE_EVERY == 0)


def fetch_apis_argument(text: str) -> tuple[str, ...]:
    """``--fetch-api 404,truth``: the passes to run, in order."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    wrong = [m for m in modes if m not in api.FETCH_APIS]
    if wrong or not modes:
        raise ValueError(f"modes are {', '.join(api.FETCH_APIS)}, comma-separated; not {text!r}")
    return modes


async def _merchant_accepts(request: web.Request) -> web.Response:
    """The demo merchant takes every effect, so the console shows them delivered."""
    await request.read()
    return web.Response(status=204)


def run_demo(settings: Settings, size: Size | None = None, seed: int = 7, keep: bool = False,
             fetch_apis: Sequence[str] = DEFAULT_FETCH_APIS, made: dict[str, str] | None = None) -> int:
    """One pass per fetch API mode, each in a namespace of its own on the same stack, every pass
    with the same seeded lifecycles and deliveries; exit 0 only if every pass matched. ``made``: the
    credentials app/stack/credentials.py drew for this stack (printed once it is up)."""
    size = size or Size()
    api_port = spare_port()
    base = settings.with_overrides(api_urls={g.name: f"http://127.0.0.1:{api_port}" for g in registry.GATEWAYS.values()
                                             if g.fetch is not None},
                                   effects_url=f"http://127.0.0.1:{api_port}{MERCHANT_PATH}",
                                   fetch_parked_after_s=FETCH_PARKED_AFTER_S, fetch_interval_s=1.0)
    stamp = int(time.time())
    passes = [Pass(mode) for mode in fetch_apis]
    stack: Stack | None = None

    async def one(done: Pass, settings: Settings, stack: Stack) -> int:
        rng = random.Random(seed)  # seeded: the same run every time, and in every pass
        truth = lifecycles.Truth()
        events = demo_events(rng, size, truth)
        gateways = api.build(truth, events, done.fetch_api)  # the gateways' GET APIs, and the merchant's endpoint
        gateways.router.add_post(MERCHANT_PATH, _merchant_accepts)
        runner = web.AppRunner(gateways, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", api_port).start()
        try:
            return await _run(settings, stack, events, truth, rng, done, gateways[api.SERVED])
        finally:
            await runner.cleanup()

    try:
        for n, done in enumerate(passes):
            pass_settings = base.with_overrides(namespace=f"demo{stamp}_{NAMESPACE_OF[done.fetch_api]}")
            if stack is None:
                stack = Stack(pass_settings)
                stack.start()
                print(credentials.announce(made or {}, stack.stack_file), flush=True)
            else:
                _switch_namespace(stack, pass_settings)
            print(f"\npass {n + 1} of {len(passes)}: fetch API {done.fetch_api} ({FETCH_API_MEANS[done.fetch_api]}), "
                  f"namespace {pass_settings.namespace}", flush=True)
            asyncio.run(one(done, pass_settings, stack))
        _summary(passes)
        if keep and stack is not None:
            _keep_up(stack, stack.settings)
        return 0 if all(p.ok for p in passes) else 1
    finally:
        if stack is not None:
            stack.stop()


NAMESPACE_OF = {"404": "nofetch", "truth": "truth", "stale": "stale"}


def _switch_namespace(stack: Stack, settings: Settings) -> None:
    """The next pass: Kafka and PostgreSQL stay up, the Orderly processes restart on a fresh namespace."""
    from app.bootstrap import prepare
    from app.stack.process import port_accepts, stop_process, wait_until

    for child in stack.children:
        if child.proc is not None:
            stop_process(child.proc, 15)
    asyncio.run(prepare(settings))
    stack.settings = settings
    for child in stack.children:
        child.env.update(settings.to_env())
        child.next_start = 0.0
        child.start(settings.ingest_host)
    def serving(name: str, port: int, host: str) -> None:
        proc = next(c.proc for c in stack.children if c.name == name)
        if proc is not None:
            wait_until(lambda: port_accepts(port, host), 30, name, lambda: proc.poll() is None)

    names = {c.name for c in stack.children}
    for name, port, host in (("ingest", settings.ingest_port, settings.ingest_host),
                             ("admin", settings.admin_port, settings.admin_host)):
        if name in names:
            serving(name, port, host)
    stack.write_stack_file()


def _summary(passes: list[Pass]) -> None:
    if len(passes) < 2:
        return
    print(f"\n{'fetch API':<11}{'card fetches':>13}{'answered':>10}{'synced':>8}{'card = truth':>14}  read models")
    for p in passes:
        print(f"{p.fetch_api:<11}{p.card_fetches:>13}{p.card_answered:>10}{p.synced_payments:>8}"
              f"{f'{p.card_truth[0]}/{p.card_truth[1]}':>14}  "
              f"{'as the documents expect' if p.ok else 'MISMATCH'}")


def _keep_up(stack: Stack, settings: Settings) -> None:
    """`orderly demo --keep`: the stack and the console stay up on the demo's data until Ctrl-C."""
    token = settings.admin_token.reveal() if settings.admin_token is not None else None

    def started() -> None:  # printed once Ctrl-C is handled: whoever reads it may send one at once
        print(f"\nthe stack stays up on the demo's data (namespace {settings.namespace}); Ctrl-C stops it\n"
              f"  console:     {stack.admin_url}/  (admin token: {token})\n"
              f"  admin API:   curl -H 'Authorization: Bearer {token}' {stack.admin_url}/api/overview\n"
              f"  ingest:      {stack.ingest_url}\n"
              f"  commands:    orderly parked | gaps | inspect GATEWAY ID | effects list (found via "
              f".orderly/stack.json)", flush=True)

    supervise_until_stopped(stack, started)
