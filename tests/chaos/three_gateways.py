"""What the every-process chaos test is made of: the simulator's three gateways as seeded traffic
with its truth, a gateway-like poster at a steady rate, a seeded killer of the Orderly processes,
and the checks of the end state against the truth.

The traffic: every event of app/simulator/lifecycles.py's pg, card and paymos generators, each
gateway's events in creation order with a local reordering window, some redelivered later, each
deposit's correlation around its first webhook (sometimes after it: parked until it arrives).
A few events are never delivered (the gateway gave up), so the truth is reached only through the
fetcher: pg events missing from the sequence are backfilled from ``GET /v1/pay/events`` once their
gap is old, and a card payment whose authorisation never came holds a parked capture until the
fetcher asks ``GET /payments/{ref}``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import asyncpg
import orjson

from app.settings import Settings
from app.simulator import card as card_simulator
from app.simulator import lifecycles
from app.simulator import paymos as paymos_simulator
from app.simulator import pg as pg_simulator
from tests.pipeline import Running
from tests.support import read_topic, signed_headers
from topics.catalog import names

REORDER = 8  # how many positions of its gateway's stream a delivery may move
REDELIVERED = 0.05  # deliveries sent again later (the gateway did not see the 200)
PG_WITHHELD = 0.004  # pg events never delivered: backfilled by the fetcher
CARD_WITHHELD = 0.01  # card payments whose authorisation is never delivered: fetched


@dataclass(frozen=True)
class Delivery:
    kind: str  # "webhook" | "correlation"
    gateway: str
    resource: str
    body: bytes


@dataclass
class Traffic:
    truth: lifecycles.Truth
    events: list[lifecycles.Emitted]  # everything the gateways emitted (their GET APIs serve it)
    deliveries: list[Delivery]  # what the poster sends, in order
    withheld_pg: set[str]  # event ids of pg events never delivered
    withheld_card: set[str]  # payment refs whose authorisation is never delivered

    def webhooks(self) -> int:
        return sum(1 for d in self.deliveries if d.kind == "webhook")


def traffic(seed: int, deposits: int, withdrawals: int, payments: int, paymos_per_kind: int) -> Traffic:
    rng = random.Random(seed)
    truth = lifecycles.Truth()
    pg = pg_simulator.lifecycle(rng, deposits, withdrawals, truth)
    card = card_simulator.lifecycle(rng, payments, truth)
    paymos = paymos_simulator.lifecycle(rng, paymos_per_kind, truth)
    # pg: never the last tenth of the sequence, so a later event shows the gap
    withheld_pg = {orjson.loads(e.body)["id"] for e in rng.sample(pg[: len(pg) * 9 // 10], int(len(pg) * PG_WITHHELD))}
    by_payment: dict[str, list[lifecycles.Emitted]] = {}
    for e in card:
        by_payment.setdefault(e.resource, []).append(e)
    several = sorted(ref for ref, evs in by_payment.items() if len(evs) > 1)
    withheld_card = set(rng.sample(several, int(len(by_payment) * CARD_WITHHELD)))
    # (gateway, event id): ids are the gateway's own, pg's and paymos's withdrawals share some
    withheld_ids = {("pg", i) for i in withheld_pg} | {("card", orjson.loads(by_payment[ref][0].body)["id"])
                                                        for ref in withheld_card}

    keyed: list[tuple[float, Delivery]] = []
    first_position: dict[str, float] = {}
    for stream in (pg, card, paymos):
        for i, e in enumerate(stream):
            if (e.gateway, orjson.loads(e.body).get("id")) in withheld_ids:
                continue
            position = (i + rng.uniform(0, REORDER)) / len(stream)  # the three gateways side by side
            delivery = Delivery("webhook", e.gateway, e.resource, e.body)
            keyed.append((position, delivery))
            if e.gateway == "pg":
                first_position.setdefault(e.resource, position)
            if rng.random() < REDELIVERED:
                keyed.append((position + rng.uniform(0, 200) / len(stream), delivery))
    for dep, body in truth.correlations.items():
        # the merchant stores the mapping when its create call returns: mostly before the first
        # webhook, sometimes after
        at = first_position.get(dep, 0.0) + rng.uniform(-30, 5) / len(pg)
        keyed.append((at, Delivery("correlation", "pg", dep, orjson.dumps(body))))
    keyed.sort(key=lambda k: k[0])
    return Traffic(truth, pg + card + paymos, [d for _, d in keyed], withheld_pg, withheld_card)


class HasSettings(Protocol):
    @property
    def settings(self) -> Settings: ...


@dataclass
class Poster:
    """Delivers like a gateway, at a steady rate with at most ``concurrency`` requests open: a
    delivery not answered 200 (a refused connection while the ingest is down, 503 while it cannot
    append, a connection cut by a kill) is retried until it is."""

    url: str
    pipe: HasSettings
    deliveries: list[Delivery]
    acked: list[str] = field(default_factory=list)  # delivery ids the ingest answered 200 with
    acked_at: dict[str, float] = field(default_factory=dict)  # delivery id -> wall-clock time of its 200
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (wall-clock sent, seconds to the answer)
    attempts: Counter[str] = field(default_factory=Counter)  # requests sent per gateway (correlations apart)
    failures: Counter[str] = field(default_factory=Counter)  # "refused" | "503" | "cut"
    done: int = 0
    last_ok: float = 0.0  # monotonic time of the last 200

    async def run(self, rate_per_s: float, concurrency: int = 16, limit_s: float = 900,
                  stall_s: float = 60) -> None:
        """Post every delivery; fails when no delivery was answered 200 for ``stall_s`` (the
        pipeline stopped taking webhooks) or all of them took longer than ``limit_s``. Not a fixed
        multiple of the posting time: on a slower machine the same work takes longer, not forever."""
        queue: asyncio.Queue[Delivery] = asyncio.Queue()
        for d in self.deliveries:
            queue.put_nowait(d)
        started, sent = time.monotonic(), [0]
        self.last_ok = started
        timeout = aiohttp.ClientTimeout(total=15)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            senders = asyncio.gather(*(self._sender(http, queue, started, sent, rate_per_s)
                                       for _ in range(concurrency)))
            try:
                while not senders.done():
                    await asyncio.wait([senders], timeout=1.0)
                    now = time.monotonic()
                    if now - self.last_ok > stall_s:
                        why = f"no delivery answered 200 for {now - self.last_ok:.0f} s"
                    elif now - started > limit_s:
                        why = f"not every delivery answered 200 in {limit_s:.0f} s"
                    else:
                        continue
                    raise AssertionError(f"{why}: {self.progress()}")
                await senders
            finally:
                senders.cancel()
                await asyncio.gather(senders, return_exceptions=True)

    def progress(self) -> str:
        """Where the posting stands: what an on-call engineer would ask first of a slow run."""
        now = time.time()
        per_10s = Counter(int((now - sent) // 10) for sent, _ in self.latencies if now - sent < 120)
        slowest = sorted(self.latencies, key=lambda x: -x[1])[:5]
        return (f"{self.done} of {len(self.deliveries)} delivered, {len(self.acked)} webhooks acknowledged; "
                f"retried {dict(self.failures)}; answers per 10 s over the last 2 minutes (newest first) "
                f"{[per_10s.get(i, 0) for i in range(12)]}; slowest answers (seconds ago, seconds) "
                f"{[(round(now - sent), round(took, 2)) for sent, took in slowest]}")

    async def _sender(self, http: aiohttp.ClientSession, queue: asyncio.Queue[Delivery], started: float,
                      sent: list[int], rate_per_s: float) -> None:
        s = self.pipe.settings
        while True:
            try:
                d = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            slot = started + sent[0] / rate_per_s  # the steady rate: the n-th delivery not before n / rate
            sent[0] += 1
            if (wait := slot - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            if d.kind == "webhook":
                method, url = "POST", f"{self.url}/webhooks/{d.gateway}"
            else:
                method, url = "PUT", f"{self.url}/correlations/pg/deposits/{d.resource}"
            while True:
                headers = (signed_headers(d.gateway, d.body, s) if d.kind == "webhook"
                           else {"Authorization": f"Bearer {s.api_token.reveal()}"})
                self.attempts[d.gateway if d.kind == "webhook" else "correlation"] += 1
                sent_at = time.time()
                try:
                    async with http.request(method, url, data=d.body, headers=headers) as resp:
                        answer = await resp.json()
                        self.latencies.append((sent_at, time.time() - sent_at))
                        if resp.status == 200:
                            assert not answer.get("quarantined"), answer
                            self.last_ok = time.monotonic()
                            if d.kind == "webhook":
                                self.acked.append(answer["delivery_id"])
                                self.acked_at[answer["delivery_id"]] = time.time()
                            break
                        assert resp.status == 503, (resp.status, answer)  # nothing but "not stored, retry"
                        self.failures["503"] += 1
                except aiohttp.ClientConnectorError:
                    self.failures["refused"] += 1
                except (aiohttp.ClientError, TimeoutError):
                    self.failures["cut"] += 1  # the ingest died with the request open
                await asyncio.sleep(0.25)
            self.done += 1


KILLED = ("ingest", "worker", "projector", "effects", "fetcher")


@dataclass
class Killer:
    """kill -9 of a seeded choice of process at seeded moments 2-5 s apart, each started again at
    once (what its supervisor does); the ingest comes back on the same port."""

    pipe: Running
    rng: random.Random
    kills: dict[str, list[float]] = field(default_factory=dict)  # process -> monotonic kill times
    restarts: Counter[str] = field(default_factory=Counter)  # processes that exited on their own

    async def run(self, until: asyncio.Event) -> None:
        procs = self.pipe.pipeline.procs
        order: list[str] = []
        while True:
            try:
                await asyncio.wait_for(until.wait(), self.rng.uniform(2.0, 5.0))
                return
            except TimeoutError:
                pass
            if not order:  # every process once per round, in a seeded order
                order = self.rng.sample(KILLED, len(KILLED))
            name = order.pop()
            proc = procs.pop(name)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            self.kills.setdefault(name, []).append(time.monotonic())
            await asyncio.to_thread(proc.wait)
            self.pipe.pipeline.start(name)

    async def supervise(self, stop: asyncio.Event) -> None:
        """A process that exited on its own (stalled, Kafka lost) is started again, counted."""
        while not stop.is_set():
            for name, proc in list(self.pipe.pipeline.procs.items()):
                if proc.poll() is not None:
                    self.restarts[name] += 1
                    self.pipe.pipeline.start(name)
            await asyncio.sleep(0.5)


async def wait_until(check: Any, limit_s: float, what: str, explain: Any = None) -> float:
    """Poll ``check`` until it is true; seconds it took. On time-out ``explain()`` says what is missing."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > limit_s:
            why = f": {await explain()}" if explain else ""
            raise AssertionError(f"{what}: not reached in {limit_s:.0f} s{why}")
        await asyncio.sleep(0.5)
    return time.monotonic() - started


async def still_moving(conn: asyncpg.Connection, bootstrap: str, namespace: str) -> str | None:
    """What the pipeline has not finished once the fetcher is stopped: records of orderly.raw without
    their decision (its last backfills, the sweeper's), effects of orderly.effects not recorded and
    delivered (another process writes that table); None when nothing. A test checks the read models
    and replays only after this, as the decisions' read model alone can be ahead of both."""
    raw = {r.headers["delivery_id"] for r in await read_topic(bootstrap, names(namespace).raw)}
    decided = {r[0] for r in await conn.fetch(
        "SELECT delivery_id FROM webhook_events WHERE delivery_id = ANY($1::text[])", list(raw))}
    emitted = {r.key.decode() for r in await read_topic(bootstrap, names(namespace).effects) if r.key}
    settled = {r[0] for r in await conn.fetch(
        "SELECT dedupe_key FROM effects WHERE dedupe_key = ANY($1::text[]) "
        "AND (delivered_at IS NOT NULL OR dead_at IS NOT NULL)", list(emitted))}
    if raw <= decided and emitted <= settled:
        return None
    undecided_ids, unsettled = sorted(raw - decided), sorted(emitted - settled)
    return (f"{len(undecided_ids)} stored records without a decision, e.g. {undecided_ids[:5]}; "
            f"{len(unsettled)} effects emitted, not recorded and delivered, e.g. {unsettled[:5]}")


async def undecided(conn: asyncpg.Connection, acked: list[str]) -> int:
    """Acknowledged deliveries without their decision in the timeline, or still parked."""
    decided = await conn.fetchval(
        "SELECT count(*) FROM webhook_events WHERE delivery_id = ANY($1::text[]) AND outcome <> 'parked'", acked)
    return len(set(acked)) - int(decided)


async def read_models(conn: asyncpg.Connection, t: lifecycles.Truth) -> dict[str, tuple[Any, Any]]:
    """Each read model next to its truth: name -> (have, want)."""
    async def rows(sql: str) -> dict[str, Any]:
        return {r[0]: tuple(r[1:]) if len(r) > 2 else r[1] for r in await conn.fetch(sql)}

    balances = await rows("SELECT user_id, balance_minor FROM user_balances")
    paymos: dict[str, Any] = {}
    for table in ("paymos_invoices", "paymos_withdrawals", "paymos_channel_deposits"):
        paymos.update(await rows(f"SELECT id, status FROM {table}"))
    return {
        "pg deposits": (await rows("SELECT pg_deposit_id, status FROM pg_deposits"), t.pg_deposits),
        "pg withdrawals": (await rows("SELECT pg_withdrawal_id, status, filled_minor, remaining_minor "
                                      "FROM pg_withdrawals"), t.pg_withdrawals),
        "user balances": ({u: b for u, b in balances.items() if b or u in t.balances},
                          {u: b for u, b in t.balances.items() if b or u in balances}),
        "card payments": (await rows("SELECT payment_ref, state, authorised_minor, captured_minor, refunded_minor "
                                     "FROM card_payments"),
                          {r: (p["state"], p["authorised_minor"], p["captured_minor"], p["refunded_minor"])
                           for r, p in t.card.items()}),
        "paymos": (paymos, t.paymos),
    }


async def differences(conn: asyncpg.Connection, t: lifecycles.Truth) -> dict[str, Any]:
    """Per read model: how many rows differ from the truth, and a few of them (have, want)."""
    found: dict[str, Any] = {}
    for name, (have, want) in (await read_models(conn, t)).items():
        wrong = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
        if wrong:
            found[name] = (len(wrong), [(k, have.get(k), want.get(k)) for k in wrong[:5]])
    return found


async def matches_truth(conn: asyncpg.Connection, t: lifecycles.Truth) -> bool:
    return all(have == want for have, want in (await read_models(conn, t)).values())


async def assert_matches_truth(conn: asyncpg.Connection, t: lifecycles.Truth) -> None:
    for name, (have, want) in (await read_models(conn, t)).items():
        wrong = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
        assert not wrong, (f"{name}: {len(wrong)} differ from the truth, e.g. "
                           f"{[(k, have.get(k), want.get(k)) for k in wrong[:5]]}")
    assert await conn.fetchval("SELECT count(*) FROM webhook_events WHERE outcome = 'parked'") == 0
    # the ledger and the balances agree, and a source has at most one credit and one debit
    assert await conn.fetchval(
        "SELECT count(*) FROM user_balances b WHERE balance_minor <> "
        "(SELECT coalesce(sum(amount_minor), 0) FROM ledger_entries l WHERE l.user_id = b.user_id)") == 0
    assert await conn.fetchval(
        "SELECT count(*) FROM (SELECT source_id, sign(amount_minor) FROM ledger_entries "
        "GROUP BY 1, 2 HAVING count(*) > 1) x") == 0


def replay(env: Mapping[str, str], into: str, limit_s: float = 240) -> str:
    """`orderly replay --into NS` as an operator runs it, with the live processes' environment;
    its output (the command must exit 0)."""
    result = subprocess.run([sys.executable, "-m", "app.cli", "replay", "--into", into], env=dict(env),
                            capture_output=True, text=True, timeout=limit_s, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout
