"""Replay equals live when a correlation races its webhooks (issue #22).

Each round registers the correlations of settled-then-reversed deposits around their two
webhooks: one correlation before them, one at the same moment, one after both were answered, so
the correlation stands at every place among its webhooks in the log. Wherever it stands, the
merchant receives credit, release, debit and hold once each (parked events are released in log
order, as if the correlation had come first), and `orderly replay` of the log so far reports no
difference.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import uuid
from pathlib import Path

import aiohttp
import orjson

from app.replay import replay
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.pg_events import deposit
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings, signed_headers

ROUNDS = 12
WHEN = ("before", "racing", "after")  # the correlation PUT against the deposit's webhooks, a deposit each
EFFECTS = ("credit_user", "release_goods", "debit_user", "hold_goods")


async def race(pipe: Running, dep: str, when: str) -> None:
    """The correlation PUT ``when`` against the deposit's webhooks (settled, then reversed)."""
    s = pipe.settings
    correlation = orjson.dumps({"merchant_reference": f"mr_{dep}", "our_order_id": f"ord_{dep}",
                                "our_user_id": f"usr_{dep}"})
    async with aiohttp.ClientSession() as http:
        async def put() -> tuple[int, str]:
            async with http.put(f"{pipe.ingest.url}/correlations/pg/deposits/{dep}", data=correlation,
                                headers={"Authorization": f"Bearer {s.api_token.reveal()}"}) as resp:
                return resp.status, await resp.text()

        async def webhooks() -> list[int]:
            statuses = []
            for body in (deposit(dep, 5, "settled"), deposit(dep, 8, "reversed")):
                async with http.post(f"{pipe.ingest.url}/webhooks/pg", data=body,
                                     headers=signed_headers("pg", body, s)) as resp:
                    statuses.append(resp.status)
            return statuses

        if when == "before":
            (put_status, said), posted = await put(), await webhooks()
        elif when == "racing":
            (put_status, said), posted = await asyncio.gather(put(), webhooks())
        else:
            posted, (put_status, said) = await webhooks(), await put()
    assert (put_status, posted) == (200, [200, 200]), said


def test_replay_agrees_with_live_in_every_round_of_a_correlation_race(
        kafka: KafkaBroker, postgres: PostgresServer, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"race{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path) as pipe:
        for round_ in range(ROUNDS):
            deps = [f"dep_race{round_}_{when}" for when in WHEN]

            async def drive(deps: list[str]) -> None:
                await asyncio.gather(*(race(pipe, dep, when) for dep, when in zip(deps, WHEN, strict=True)))
                keys = {f"deposit:{dep}:{kind}" for dep in deps for kind in EFFECTS}
                await pipe.wait_for(lambda c: c.fetchval(
                    "SELECT count(*) = $1 FROM effects WHERE dedupe_key = ANY($2::text[])", len(keys), list(keys)))
                await pipe.wait_for(lambda c: c.fetchval(
                    "SELECT count(*) = 0 FROM webhook_events WHERE outcome = 'parked'"))
                balances = await pipe.wait_for(lambda c: c.fetch(
                    "SELECT user_id, sum(amount_minor) AS balance FROM ledger_entries WHERE user_id = ANY($1::text[]) "
                    "GROUP BY user_id HAVING count(*) = 2", [f"usr_{dep}" for dep in deps]),
                    until=lambda rows: len(rows) == len(deps))
                assert sorted((r["user_id"], r["balance"]) for r in balances) == sorted((f"usr_{d}", 0) for d in deps)
                for _ in range(100):  # the merchant stub: each of the four effects once per deposit
                    if all(pipe.stub.deliveries[key] >= 1 for key in keys):
                        break
                    await asyncio.sleep(0.1)
                assert {key: pipe.stub.deliveries[key] for key in keys} == dict.fromkeys(keys, 1)

            asyncio.run(drive(deps))
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = replay(pipe.settings, f"rr{round_}{uuid.uuid4().hex[:6]}", tmp_path / "replay", limit_s=120)
            assert code == 0, f"round {round_}:\n{out.getvalue()}"
