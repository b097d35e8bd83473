"""Kafka dies in the middle of a burst: only 503s while it is down, no 2xx without a stored
record, and 2xx again once it is back."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import orjson

from app.bootstrap import prepare
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.support import make_settings, read_topic, serve_ingest, signed_headers
from topics.catalog import names


async def test_broker_outage_mid_burst(postgres: PostgresServer, namespace: str, tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path / "kafka")  # our own broker: this test kills it
    broker.start()
    try:
        s = make_settings(broker.bootstrap, postgres.dsn, namespace, append_timeout_s=5.0)
        # the production default (5 s): a broker restarted cold on shared cores answers within it
        await prepare(s)
        counter = itertools.count()
        answers: list[tuple[str, int, str | None]] = []  # (phase, status, delivery id)
        phase = "before"

        async def client(http: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> None:
            while not stop.is_set():
                i = next(counter)
                body = orjson.dumps({"id": f"evt_{i}", "object": "event", "type": "deposit.updated",
                                     "sequence": i, "created": "2026-11-29T10:00:00Z",
                                     "data": {"object": {"id": f"dep_{i % 25}", "object": "deposit",
                                                         "version": i, "status": "pending",
                                                         "ordered_amount_minor": 500_000}}})
                sent_in = phase
                async with http.post(f"{url}/webhooks/pg", data=body, headers=signed_headers("pg", body, s)) as r:
                    answer = await r.json()
                    answers.append((sent_in, r.status, answer.get("delivery_id")))

        with serve_ingest(s) as ingest:
            async with aiohttp.ClientSession() as http:
                stop = asyncio.Event()
                clients = [asyncio.create_task(client(http, ingest.url, stop)) for _ in range(8)]

                async def until(ok: Callable[[], bool], what: str, limit_s: float = 60) -> None:
                    deadline = time.monotonic() + limit_s
                    while not ok():
                        assert time.monotonic() < deadline, f"{what}: not in {limit_s:.0f} s"
                        await asyncio.sleep(0.05)

                await until(lambda: sum(1 for a in answers if a[1] == 200) >= 150, "150 acknowledged before the kill")
                await asyncio.to_thread(broker.kill)  # kill -9 mid-burst
                phase = "down"
                # not a wait: the broker stays down 15 s on purpose (three append deadlines of 5 s),
                # so that requests sent well after the kill can be checked to fail
                await asyncio.sleep(15)
                phase = "restarting"
                await asyncio.to_thread(broker.start)
                # the ingest's producer reconnects on its own: until a request sent meanwhile is acked
                await until(lambda: any(a[0] == "restarting" and a[1] == 200 for a in answers),
                            "a 2xx after the restart")
                phase = "after"
                await until(lambda: sum(1 for a in answers if a[0] == "after" and a[1] == 200) >= 50,
                            "50 acknowledged after the restart")
                stop.set()
                await asyncio.gather(*clients)

        statuses = {status for _, status, _ in answers}
        assert statuses <= {200, 503}, statuses
        down = [status for p, status, _ in answers if p == "down"]
        # requests sent well after the kill can only fail (the first few may have been acked before)
        assert down and down[-20:] == [503] * len(down[-20:])
        # once the ingest acknowledges again, every request sent from then on is acknowledged
        after = [status for p, status, _ in answers if p == "after"]
        assert after.count(503) == 0, f"{after.count(503)} of {len(after)} refused after the broker was back"
        acked = {d for _, status, d in answers if status == 200}
        stored = {r.headers["delivery_id"] for r in await read_topic(broker.bootstrap, names(s.namespace).raw)}
        assert acked <= stored, f"{len(acked - stored)} acknowledged webhooks are not in orderly.raw"
    finally:
        broker.stop()
