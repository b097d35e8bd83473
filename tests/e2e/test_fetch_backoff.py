"""The card fetcher backs off a payment the gateway keeps answering the same way (here 404): it is
asked again after twice the wait each time, so payments no answer resolves cannot take every pass
and starve the payments parked after them (app/fetcher.py, MAX_BACKOFF_S)."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator

import aiohttp
import pytest

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from tests.card_api import CardApi, answer, serve_card_api
from tests.e2e.test_rules_card import card_event, until
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings

PARKED_AFTER_S = 1.0
INTERVAL_S = 0.25


@pytest.fixture(scope="module")
def api() -> Iterator[CardApi]:
    with serve_card_api() as served:
        yield served


@pytest.fixture(scope="module")
def fetcher_metrics() -> int:
    """The fetcher's /metrics port, picked just before its start (below the ephemeral range)."""
    return spare_port()


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, api: CardApi, fetcher_metrics: int,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"fb{uuid.uuid4().hex[:8]}", api_urls={"card": api.url},
                      fetch_parked_after_s=PARKED_AFTER_S, fetch_interval_s=INTERVAL_S)
    with running_pipeline(s, tmp_path_factory.mktemp("fetch-backoff"), metrics_ports={"fetcher": fetcher_metrics}) \
            as running:
        yield running


async def passes(port: int) -> int:
    """The fetcher's passes over parked resources so far (orderly_fetcher_passes_total)."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    return int(float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("orderly_fetcher_passes_total "))))


@pytest.mark.timeout(120)
async def test_a_payment_answered_404_again_is_asked_after_doubling_waits(pipe: Running, api: CardApi,
                                                                          fetcher_metrics: int) -> None:
    stuck = f"pay_gone{uuid.uuid4().hex[:6]}"
    await pipe.post("card", card_event(stuck, f"{stuck}_c", "captured", 1, 5000))  # no authorisation: parks
    await until("four GETs of the payment that answers 404", lambda: api.calls[stuck] >= 4, timeout=60)
    at = api.asked_at[stuck]
    gaps = [b - a for a, b in itertools.pairwise(at)]
    # without the backoff the fetcher asks on every pass, 0.25 s apart; with it the second ask comes
    # on the next pass, then after 2 s, then after 4 s (PARKED_AFTER_S * 2^repeats)
    assert gaps[0] < 2 * PARKED_AFTER_S, gaps
    assert 2 * PARKED_AFTER_S <= gaps[1] < 2 * PARKED_AFTER_S + 2, gaps
    assert 4 * PARKED_AFTER_S <= gaps[2] < 4 * PARKED_AFTER_S + 2, gaps

    # a payment parked while the first one waits out its backoff is fetched as soon as it is due
    fresh = f"pay_new{uuid.uuid4().hex[:6]}"
    api.payments[fresh] = answer(fresh, "captured", 3000, 3000, 0)
    await pipe.post("card", card_event(fresh, f"{fresh}_c", "captured", 1, 3000))
    # timed from its row in the read model (parked there, which the fetcher reads), not from the
    # post: the pipeline's way there on busy cores is not what is checked
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT true FROM webhook_events WHERE gateway = 'card' AND resource_id = $1", fresh))
    parked_seen = time.time()
    await until("the fresh payment's fetch", lambda: api.calls[fresh] >= 1, timeout=30)
    # due PARKED_AFTER_S after it parked, and asked at the next look: not after the first one's 8 s backoff
    assert api.asked_at[fresh][0] - parked_seen < PARKED_AFTER_S + 3
    row = await pipe.wait_for(lambda c: c.fetchrow(
        "SELECT state, captured_minor FROM card_payments WHERE payment_ref = $1 AND captured_minor = 3000", fresh))
    assert (row["state"], row["captured_minor"]) == ("captured", 3000)
    # and it is not asked again: the synced base covered its parked capture
    calls, then = api.calls[fresh], await passes(fetcher_metrics)
    # three passes of the fetcher since (a positive signal, not a sleep): each would ask again if the
    # payment were still parked
    deadline = time.monotonic() + 30
    while await passes(fetcher_metrics) < then + 3:
        assert time.monotonic() < deadline, "the fetcher made no three passes in 30 s"
        await asyncio.sleep(0.05)
    assert api.calls[fresh] == calls


@pytest.mark.timeout(120)
async def test_errors_of_the_api_do_not_lengthen_the_wait(pipe: Running, api: CardApi) -> None:
    ref = f"pay_err{uuid.uuid4().hex[:6]}"
    api.failing.add(ref)  # the API's trouble, not the payment's
    await pipe.post("card", card_event(ref, f"{ref}_c", "captured", 1, 5000))
    # each pass asks 3 times (0.4 s, 0.8 s apart); the next pass follows within a look interval
    await until("four passes of GETs answered 503", lambda: api.calls[ref] >= 12, timeout=60)
    at = api.asked_at[ref]
    between_passes = [at[i + 1] - at[i] for i in (2, 5, 8)]
    # 1.6 s after the third try, then the next look; a doubling wait would add 2 s, then 4 s
    assert all(gap < 3.5 for gap in between_passes), between_passes
    # once the API is back the payment is fetched and synced at the next pass
    api.failing.discard(ref)
    api.payments[ref] = answer(ref, "captured", 5000, 5000, 0)
    row = await pipe.wait_for(lambda c: c.fetchrow(
        "SELECT state FROM card_payments WHERE payment_ref = $1 AND captured_minor = 5000", ref), timeout=30)
    assert row["state"] == "captured"
