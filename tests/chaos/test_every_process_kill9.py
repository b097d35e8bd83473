"""Every Orderly process kill -9'd again and again while more than 12,000 webhooks of the three
gateways flow: the ingest (a real process, back on the same port), the worker, the projector, the
effects worker and the fetcher, one at a seeded moment every 2-5 s, each started again at once.
The fetcher has the gateways' GET APIs to call (some events are never delivered), so its kills
matter too.

Afterwards: every webhook the ingest acknowledged has its decision, every read model equals the
gateways' truth, the merchant received every effect once (a repeat only for a key whose first
delivery was within one lease before an effects-worker kill: the crash between the merchant's
answer and marking the row delivered; the repeat carries the same Idempotency-Key), and
`orderly replay` rebuilds the same read models from the log."""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from app.simulator import api
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from tests.chaos.three_gateways import (
    Killer,
    Poster,
    Traffic,
    assert_matches_truth,
    differences,
    matches_truth,
    replay,
    still_moving,
    traffic,
    undecided,
    wait_until,
)
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings, read_topic, serve_in_thread
from topics.catalog import names

pytestmark = pytest.mark.chaos
SEED = int(os.environ.get("ORDERLY_CHAOS_SEED", "23"))  # another seed: ORDERLY_CHAOS_SEED=N
LEASE_S = 3.0
IN_FLIGHT_S = 1.0  # a request sent just before a kill reaches the merchant this long after it at most
RATE_PER_S = 250.0  # the gateways' deliveries per second, together


@pytest.fixture
def flow() -> Traffic:
    return traffic(SEED, deposits=1320, withdrawals=330, payments=1320, paymos_per_kind=390)


@pytest.fixture
def pipe(flow: Traffic, kafka: KafkaBroker, postgres: PostgresServer, tmp_path: Path) -> Iterator[Running]:
    with serve_in_thread(api.build(flow.truth, flow.events)) as gateway_api:
        s = make_settings(kafka.bootstrap, postgres.dsn, f"every{uuid.uuid4().hex[:8]}",
                          effects_lease_s=LEASE_S, effects_timeout_s=LEASE_S - 1, append_timeout_s=2.0,
                          worker_stall_s=10.0, sweep_after_s=5.0,
                          ingest_port=spare_port(),  # outside the ephemeral range: kept while the ingest is down
                          api_urls={"card": gateway_api, "pg": gateway_api},
                          fetch_parked_after_s=3.0, fetch_interval_s=1.0, gap_backfill_after_s=6.0)
        with running_pipeline(s, tmp_path) as running:
            running.pipeline.start("ingest")  # `orderly ingest`, on ORDERLY_INGEST_PORT after every restart
            yield running


async def ingest_ready(url: str, limit_s: float = 60) -> None:
    async def ready() -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(f"{url}/readyz") as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False
    await wait_until(ready, limit_s, "the ingest ready")


@pytest.mark.timeout(600)  # about 3x its duration (148-168 s measured alone)
async def test_kill_9_every_process_while_12000_webhooks_of_three_gateways_flow(flow: Traffic, pipe: Running) -> None:
    assert flow.webhooks() >= 12_000
    started = time.monotonic()
    url = f"http://127.0.0.1:{pipe.settings.ingest_port}"
    await ingest_ready(url)
    poster = Poster(url, pipe, flow.deliveries)
    killer = Killer(pipe, random.Random(SEED))
    posted, stop = asyncio.Event(), asyncio.Event()
    killing = asyncio.create_task(killer.run(posted))
    watchdog = asyncio.create_task(killer.supervise(stop))
    await poster.run(RATE_PER_S, limit_s=400)
    posted.set()
    await killing
    posting_s = time.monotonic() - started
    last_kill = max(t for times in killer.kills.values() for t in times)
    assert set(killer.kills) == {"ingest", "worker", "projector", "effects", "fetcher"}

    conn = await pipe.connect()
    try:
        async def settled() -> bool:
            effects = await conn.fetchrow("SELECT count(*) FILTER (WHERE delivered_at IS NULL) AS pending, "
                                          "array_agg(dedupe_key) AS keys FROM effects")
            assert effects is not None
            return (await undecided(conn, poster.acked) == 0 and await matches_truth(conn, flow.truth)
                    and effects["pending"] == 0 and set(effects["keys"] or ()) == set(pipe.stub.deliveries))
        async def explain() -> str:
            decided = {r[0]: r[1] for r in await conn.fetch(
                "SELECT delivery_id, outcome FROM webhook_events WHERE delivery_id = ANY($1::text[])", poster.acked)}
            missing = [a for a in poster.acked if decided.get(a, "parked") == "parked"]
            parked = await conn.fetch("SELECT gateway, resource_id, event_type, error FROM webhook_events "
                                      "WHERE outcome = 'parked' LIMIT 5")
            keys = {r[0] for r in await conn.fetch("SELECT dedupe_key FROM effects WHERE delivered_at IS NULL")}
            return (f"{len(missing)} acknowledged undecided or parked (e.g. {missing[:3]}), parked rows "
                    f"{[tuple(r) for r in parked]}; differences from the truth {await differences(conn, flow.truth)}; "
                    f"{len(keys)} effects undelivered; processes {pipe.pipeline.procs.keys()}")
        await wait_until(settled, 240, "every acknowledged webhook decided, the truth reached, every effect delivered",
                         explain)
        catch_up_s = time.monotonic() - last_kill

        # What was never delivered comes through the fetcher: pg events backfilled (a gap is asked
        # for once it is gap_backfill_after_s old, and the fetcher was killed too), card payments synced.
        # The read models can equal the truth before then (a withheld event a later snapshot covers).
        async def fetched() -> tuple[set[str], set[str]]:
            pg = {r[0] for r in await conn.fetch(
                "SELECT event_id FROM webhook_events WHERE gateway = 'pg' AND delivery_id LIKE 'fetch-%'")}
            card = {r[0] for r in await conn.fetch(
                "SELECT resource_id FROM webhook_events WHERE gateway = 'card' AND outcome = 'synced'")}
            return flow.withheld_pg - pg, flow.withheld_card - card

        async def all_fetched() -> bool:
            return not any(await fetched())

        async def explain_fetched() -> str:
            pg, card = await fetched()
            gaps = await conn.fetch("SELECT start_seq, end_seq, first_seen_at, backfill_requested_at "
                                    "FROM pg_sequence_gaps ORDER BY start_seq LIMIT 8")
            return (f"never backfilled: {sorted(pg)[:5]}, never fetched: {sorted(card)[:5]}; open gaps "
                    f"{[tuple(r) for r in gaps]}")
        fetch_s = await wait_until(all_fetched, 120, "every withheld event fetched", explain_fetched)
        stop.set()
        await watchdog
        # The fetcher still carries out backfill requests queued in orderly.fetch, appending records
        # with new delivery ids: stopped now, so the log replay copies is the one the live side decided.
        pipe.pipeline.terminate("fetcher")
        # nothing stored stays undecided, acknowledged or not (an answer lost with a killed ingest)
        raw = {r.headers["delivery_id"]: r for r in await read_topic(pipe.settings.kafka_bootstrap,
                                                                     names(pipe.settings.namespace).raw)}

        async def decided() -> set[str]:
            return {r[0] for r in await conn.fetch(
                "SELECT delivery_id FROM webhook_events WHERE delivery_id = ANY($1::text[])", list(raw))}

        async def all_stored_decided() -> bool:
            pipe.pipeline.restart_stalled()  # as its supervisor would
            return len(await decided()) == len(raw)

        async def explain_stored() -> str:
            have = await decided()
            missing = [(d, r.partition, r.offset, r.headers) for d, r in raw.items() if d not in have]
            return f"{len(missing)} records of orderly.raw without a decision, e.g. {missing[:6]}"
        sweep_s = await wait_until(all_stored_decided, 60, "every stored record decided", explain_stored)

        async def effects_done() -> bool:  # the effects of the decisions just made, another process's table
            return await still_moving(conn, pipe.settings.kafka_bootstrap, pipe.settings.namespace) is None

        async def moving() -> str:
            return str(await still_moving(conn, pipe.settings.kafka_bootstrap, pipe.settings.namespace))
        await wait_until(effects_done, 60, "every emitted effect recorded and delivered", moving)

        assert await undecided(conn, poster.acked) == 0
        await assert_matches_truth(conn, flow.truth)
        registered = await conn.fetchval("SELECT count(DISTINCT resource_id) FROM webhook_events "
                                         "WHERE event_type = 'correlation.registered'")
        assert registered == len(flow.truth.correlations)
        assert await fetched() == (set(), set())  # still there after the fetcher stopped
        repeated = {k: n for k, n in pipe.stub.deliveries.items() if n > 1}
        attempts = {r["dedupe_key"]: r["attempts"] for r in await conn.fetch(
            "SELECT dedupe_key, attempts FROM effects WHERE dedupe_key = ANY($1::text[])", sorted(repeated))}
    finally:
        await conn.close()

    # A POST is repeated only when the effects worker was killed between the merchant's answer and
    # marking the row delivered: its first delivery was within one lease before such a kill, or just
    # after it when the request was on its way as the worker died (the merchant answered it, nobody read it);
    # or when an attempt failed on its side: the answer came after ORDERLY_EFFECTS_TIMEOUT_S (the stub
    # shares this busy process), recorded as a failed attempt before the one marked delivered.
    effects_kills = killer.kills["effects"]
    offsets = {k: min((pipe.stub.first_at[k] - kill for kill in effects_kills), key=abs) for k in repeated}
    unexplained = {k: round(o, 2) for k, o in offsets.items()
                   if not -LEASE_S <= o <= IN_FLIGHT_S and attempts[k] <= 1}
    assert not unexplained, f"{len(unexplained)} effects delivered more than once without an effects-worker " \
                            f"kill to explain it (key: seconds from the nearest kill) {list(unexplained.items())[:8]}"
    # one crash window, one repeat: the worker started again sends the row once and marks it
    assert {n for n in repeated.values()} <= {2}, f"delivered three times or more: {repeated}"
    assert pipe.stub.requests == pipe.stub.deliveries  # the merchant refused nothing

    pipe.pipeline.stop()  # the live processes are done; the replay has the machine
    delivered = sum(pipe.stub.deliveries.values())
    replay_started = time.monotonic()
    out = await asyncio.to_thread(replay, pipe.pipeline.env, f"rb{uuid.uuid4().hex[:8]}")
    assert "no difference from the live namespace" in out, out
    assert sum(pipe.stub.deliveries.values()) == delivered  # nothing delivered again

    print(f"\nseed {SEED}: {flow.webhooks()} webhooks ({len(flow.truth.correlations)} correlations) posted in "
          f"{posting_s:.0f} s; requests sent {dict(poster.attempts)}, acknowledged {len(poster.acked)}, retried "
          f"{dict(poster.failures)}; kills {({k: len(v) for k, v in killer.kills.items()})}, exited on their own and "
          f"restarted {dict(killer.restarts) or 'none'}; withheld and fetched: {len(flow.withheld_pg)} pg events, "
          f"{len(flow.withheld_card)} card payments; repeated effect POSTs {sum(n - 1 for n in repeated.values())} "
          f"(keys {len(repeated)}, first delivered {min(offsets.values(), default=0):.2f} to "
          f"{max(offsets.values(), default=0):.2f} s from an effects kill); "
          f"caught up {catch_up_s:.0f} s after the last kill, withheld events all fetched {fetch_s:.0f} s later, "
          f"{len(raw)} stored records decided "
          f"{sweep_s:.0f} s later; replay {time.monotonic() - replay_started:.0f} s:\n{out}")
