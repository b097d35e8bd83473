"""What the chaos tests share: a seeded pg traffic scenario with its truth, a gateway-like poster
that retries every delivery until it is acknowledged, what orderly.raw logged of it (and so what the
gateway's document says each deposit must cause), and the checks of the end state."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg
import orjson

from tests.pg_events import AMOUNT, deposit
from tests.pg_truth import DepositTruth, deposit_truth
from tests.pipeline import Running
from tests.support import read_topic, signed_headers
from topics.catalog import names
from topics.records import CORRELATION, H_RECORD

Item = tuple[str, str, bytes]  # ("pg" | "corr", deposit id, body)


def scenario(seed: int, deposits: int) -> tuple[list[Item], dict[str, str]]:
    """Every deposit's lifecycle (a fifth reversed after settling) plus its correlation, shuffled
    per deposit, with redeliveries, and the deposits interleaved; and each deposit's final status."""
    rng = random.Random(seed)
    truth: dict[str, str] = {}
    per_deposit: list[list[Item]] = []
    for i in range(deposits):
        dep = f"dep_k{i}"
        statuses = ["pending", "slip_received", "settled"] + (["reversed"] if rng.random() < 0.2 else [])
        truth[dep] = statuses[-1]
        items: list[Item] = [("pg", dep, deposit(dep, v + 1, st, sequence=i * 10 + v))
                             for v, st in enumerate(statuses)]
        items.append(("corr", dep, orjson.dumps({"merchant_reference": f"mr_{dep}", "our_order_id": f"o_{dep}",
                                                 "our_user_id": f"u_{dep}"})))
        items += rng.sample(items, k=rng.randint(0, 2))  # redeliveries
        rng.shuffle(items)
        per_deposit.append(items)
    stream: list[Item] = []
    while per_deposit:
        lane = rng.randrange(len(per_deposit))
        stream.append(per_deposit[lane].pop(0))
        if not per_deposit[lane]:
            per_deposit.pop(lane)
    return stream, truth


@dataclass
class Poster:
    """Delivers the stream like a gateway: a delivery that is not answered 200 (503 while Kafka is
    down, a refused connection) is retried until it is, within ``limit_s``."""

    pipe: Running
    stream: list[Item]
    acked: list[str] = field(default_factory=list)  # delivery ids the ingest acknowledged
    done: int = 0
    retries: int = 0

    async def run(self, concurrency: int = 12, limit_s: float = 300, pause_s: float = 0.0) -> None:
        """Deliver everything; each of the ``concurrency`` senders waits ``pause_s`` after each
        delivery (to make the flow last)."""
        queue: asyncio.Queue[Item] = asyncio.Queue()
        for item in self.stream:
            queue.put_nowait(item)
        async with asyncio.timeout(limit_s), aiohttp.ClientSession() as http:
            await asyncio.gather(*(self._worker(http, queue, pause_s) for _ in range(concurrency)))

    async def reached(self, fraction: float, limit_s: float = 300) -> None:
        deadline = time.monotonic() + limit_s
        while self.done < len(self.stream) * fraction:
            assert time.monotonic() < deadline, f"{self.done} of {len(self.stream)} delivered in {limit_s:.0f} s"
            await asyncio.sleep(0.05)

    async def _worker(self, http: aiohttp.ClientSession, queue: asyncio.Queue[Item], pause_s: float) -> None:
        s = self.pipe.settings
        while True:  # until the queue is empty; run()'s asyncio.timeout bounds it and the retries below
            try:
                kind, dep, body = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if kind == "pg":
                url, method, headers = f"{self.pipe.ingest.url}/webhooks/pg", "POST", signed_headers("pg", body, s)
            else:
                url, method = f"{self.pipe.ingest.url}/correlations/pg/deposits/{dep}", "PUT"
                headers = {"Authorization": f"Bearer {s.api_token.reveal()}"}
            while True:
                try:
                    async with http.request(method, url, data=body, headers=headers) as resp:
                        answer = await resp.json()
                        if resp.status == 200:
                            if "delivery_id" in answer:
                                self.acked.append(answer["delivery_id"])
                            break
                        assert resp.status == 503, (resp.status, answer)  # nothing but "not stored, retry"
                except (aiohttp.ClientError, TimeoutError):
                    pass
                self.retries += 1
                await asyncio.sleep(0.2)
            self.done += 1
            if pause_s:
                await asyncio.sleep(pause_s)


async def wait_until(check: Any, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {limit_s:.0f} s")
        await asyncio.sleep(0.5)


@dataclass
class Logged:
    """What orderly.raw holds once the stream is posted: the delivery id of every pg webhook stored
    (a delivery stored but not acknowledged before a crash is posted again: it is there twice, under
    two ids), and what the gateway's document says each deposit's webhooks, in log order, must cause."""

    deliveries: set[str]
    deposits: dict[str, DepositTruth]

    def effects(self) -> set[str]:
        return {key for t in self.deposits.values() for key in t.effects}

    def ledger(self) -> dict[str, tuple[str, int, str]]:
        """entry key -> (user, amount, deposit)."""
        return {key: (f"u_{dep}", amount, dep) for dep, t in self.deposits.items() for key, amount in t.ledger.items()}


async def logged(pipe: Running) -> Logged:
    """Read once every delivery is acknowledged (a record the sweeper appends again later is the same
    delivery with the same body: stale in the model, a duplicate for the worker)."""
    bodies: dict[str, list[bytes]] = defaultdict(list)
    deliveries: set[str] = set()
    for r in await read_topic(pipe.settings.kafka_bootstrap, names(pipe.settings.namespace).raw):
        if r.headers.get(H_RECORD) == CORRELATION:
            continue  # where it stands changes nothing: parked events are applied in log order
        deliveries.add(r.headers["delivery_id"])
        assert r.key is not None and r.value is not None
        bodies[r.key.decode().partition(":")[2]].append(r.value)  # one partition per deposit: its log order
    return Logged(deliveries, {dep: deposit_truth(b) for dep, b in bodies.items()})


async def converged(conn: asyncpg.Connection, log: Logged) -> bool:
    """Every pg delivery stored has its decision in the timeline and none is still parked."""
    done = await conn.fetchval("SELECT count(*) FROM webhook_events WHERE event_type <> 'correlation.registered' "
                               "AND outcome <> 'parked' AND delivery_id = ANY($1)", list(log.deliveries))
    return bool(done == len(log.deliveries))


async def assert_matches_truth(conn: asyncpg.Connection, truth: dict[str, str], log: Logged) -> None:
    """Read models and balances equal the gateway's truth; the timeline holds exactly the stored
    deliveries; the ledger is exactly the credits and debits the document derives from the log."""
    rows = {r["pg_deposit_id"]: r["status"] for r in await conn.fetch("SELECT pg_deposit_id, status FROM pg_deposits")}
    assert rows == truth, f"{sum(rows.get(d) != s for d, s in truth.items())} deposits differ from the truth"
    balances = {r["user_id"]: r["balance_minor"] for r in await conn.fetch("SELECT * FROM user_balances")}
    wrong = [d for d, final in truth.items() if balances.get(f"u_{d}", 0) != (AMOUNT if final == "settled" else 0)]
    assert not wrong, f"{len(wrong)} balances differ from the truth, e.g. {wrong[:5]}"
    assert await conn.fetchval("SELECT count(*) FROM webhook_events WHERE outcome = 'parked'") == 0
    timeline = {r["delivery_id"] for r in await conn.fetch(
        "SELECT delivery_id FROM webhook_events WHERE event_type <> 'correlation.registered'")}
    assert timeline == log.deliveries, (f"{len(log.deliveries - timeline)} stored deliveries without a decision, "
                                        f"{len(timeline - log.deliveries)} decisions of nothing stored")
    # a settled deposit: one credit of its amount; a reversed one: a credit and a debit of the same
    # amount if the settlement was logged before the reversal, else neither
    ledger = {r["entry_key"]: (r["user_id"], r["amount_minor"], r["source_id"])
              for r in await conn.fetch("SELECT * FROM ledger_entries")}
    expected = log.ledger()
    assert ledger == expected, (f"{len(expected.keys() - ledger.keys())} ledger entries missing, "
                                f"{len(ledger.keys() - expected.keys())} not in the truth, e.g. "
                                f"{sorted(ledger.keys() ^ expected.keys())[:5]}, "
                                f"{sum(ledger[k] != expected[k] for k in ledger.keys() & expected.keys())} differ")
    settled = {d for d, final in truth.items() if final == "settled"}
    assert {v[2] for k, v in ledger.items() if k.endswith(":credit_user")} >= settled
