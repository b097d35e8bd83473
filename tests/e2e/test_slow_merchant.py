"""A merchant slow for some effects (issue #46, faults): one deposit's credit answered only after
30 s (the first two attempts; then the merchant is quick again), another's never answered. The
effects worker gives each request ORDERLY_EFFECTS_TIMEOUT_S (the default, 10 s), so both
time out and are retried on their schedule (the timeout, then the backoff: 0.25-0.5 s, 0.5-1 s,
...), the never-answered ones until they are dead after ORDERLY_EFFECTS_MAX_ATTEMPTS. Meanwhile
the other effects keep flowing through the free slots, the requests in flight never pass
ORDERLY_EFFECTS_CONCURRENCY (counted at the merchant), no effect has two requests open at once,
and none is answered 2xx twice."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson
import pytest
from aiohttp import web

from app.effects import backoff_ceiling_s
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.e2e.test_effects_delivery import EFFECT_KINDS, effect_rows
from tests.pg_events import deposit
from tests.pipeline import EffectsStub, Running, running_pipeline
from tests.support import make_settings, serve_in_thread

CONCURRENCY = 4
MAX_ATTEMPTS = 3
REQUEST_TIMEOUT_S = 10.0  # ORDERLY_EFFECTS_TIMEOUT_S given to the effects process: the default, a third of the wait
SLOW_S, SLOW_ATTEMPTS = 30.0, 2  # the slow deposit's effects: answered after 30 s, twice
FAST_HOLD_S = 0.25  # every other request: held this long, so that the free slots fill up
NEVER_S = 3600.0


@dataclass
class Merchant:
    """The merchant's endpoint: verifies each signature (tests/pipeline.EffectsStub.verify), answers
    2xx after a delay chosen per resource, and counts requests open at once, overall and per key."""

    check: EffectsStub
    slow: str = ""  # the dedupe key answered after 30 s
    never: str = ""  # the dedupe key never answered
    url: str = ""
    started: dict[str, list[float]] = field(default_factory=dict)  # key -> monotonic start of each request
    answered: Counter[str] = field(default_factory=Counter)  # 2xx written to a connection still open
    open_now: int = 0
    most_open: int = 0
    open_per_key: Counter[str] = field(default_factory=Counter)
    most_open_per_key: int = 0
    rejected: list[str] = field(default_factory=list)
    while_held: set[str] = field(default_factory=set)  # keys first sent while both slow keys held a slot

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if (why := self.check.verify(body, request.headers)) is not None:
            self.rejected.append(why)
            return web.Response(status=400, text=why)
        key = request.headers["webhook-id"]
        assert orjson.loads(body)["dedupe_key"] == key
        self.started.setdefault(key, []).append(time.monotonic())
        if self.open_per_key[self.slow] and self.open_per_key[self.never] and len(self.started[key]) == 1:
            self.while_held.add(key)
        self.open_now += 1
        self.open_per_key[key] += 1
        self.most_open = max(self.most_open, self.open_now)
        self.most_open_per_key = max(self.most_open_per_key, self.open_per_key[key])
        try:
            if key == self.never:
                await asyncio.sleep(NEVER_S)
            elif key == self.slow and len(self.started[key]) <= SLOW_ATTEMPTS:
                await asyncio.sleep(SLOW_S)
            else:
                await asyncio.sleep(FAST_HOLD_S)
        finally:
            self.open_now -= 1
            self.open_per_key[key] -= 1
        response = web.Response(status=204)
        await response.prepare(request)  # raises if the sender is gone: not an answer it heard
        self.answered[key] += 1
        return response


@pytest.fixture
def pipe(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"sm{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path_factory.mktemp("slow-merchant")) as running:
        yield running


@pytest.mark.timeout(240)
async def test_slow_and_silent_merchants_hold_their_slots_only(pipe: Running) -> None:
    assert pipe.settings.effects_secret is not None
    slow, never = "deposit:dep_slow:credit_user", "deposit:dep_never:credit_user"
    merchant = Merchant(EffectsStub(secret=pipe.settings.effects_secret.reveal()), slow=slow, never=never)
    app = web.Application()
    app.router.add_post("/effects", merchant.handle)
    with serve_in_thread(app, handler_cancellation=True) as url:
        pipe.pipeline.terminate("effects")
        pipe.pipeline.start("effects", ORDERLY_EFFECTS_URL=f"{url}/effects",
                            ORDERLY_EFFECTS_CONCURRENCY=str(CONCURRENCY),
                            ORDERLY_EFFECTS_MAX_ATTEMPTS=str(MAX_ATTEMPTS),
                            ORDERLY_EFFECTS_TIMEOUT_S=f"{REQUEST_TIMEOUT_S:g}")
        # the two slow credits first: they hold two of the four slots while 40 quick effects (and
        # the two deposits' release_goods) go through the other two
        quick = [f"dep_q{i}" for i in range(20)]
        await pipe.correlate(["dep_slow", "dep_never", *quick])
        await pipe.post("pg", deposit("dep_slow", 3, "settled"), deposit("dep_never", 3, "settled"))
        deadline = time.monotonic() + 60
        while not (slow in merchant.started and never in merchant.started):
            assert time.monotonic() < deadline, merchant.started
            await asyncio.sleep(0.1)
        first_slow = min(merchant.started[slow][0], merchant.started[never][0])
        await pipe.post("pg", *(deposit(d, 3, "settled") for d in quick))
        quick_keys = sorted(f"deposit:{d}:{k}" for d in quick for k in EFFECT_KINDS)
        delivered = await effect_rows(pipe, quick_keys, "delivered_at", timeout=60)
        quick_done = time.monotonic()

        dead = await effect_rows(pipe, [never], "dead_at", timeout=120)
        came = await effect_rows(pipe, [slow], "delivered_at", timeout=120)
        pipe.pipeline.terminate("effects")

    assert not merchant.rejected, merchant.rejected[:3]
    # the quick effects flowed while the slow ones held their slots: many sent while both first slow
    # requests were still open, all delivered before the second slow attempts had timed out, each once
    meanwhile = merchant.while_held & set(quick_keys)
    assert len(meanwhile) >= 8, len(meanwhile)
    assert quick_done - first_slow < 2 * REQUEST_TIMEOUT_S + 5, quick_done - first_slow
    assert {k: merchant.answered[k] for k in quick_keys} == dict.fromkeys(quick_keys, 1)
    assert all(r["attempts"] == 1 for r in delivered.values())
    # the bound held and was reached; never two requests for one key at once
    assert merchant.most_open == CONCURRENCY, merchant.most_open
    assert merchant.most_open_per_key == 1
    # never answered: MAX_ATTEMPTS requests, each timed out, then dead; answered after 30 s: timed
    # out twice, delivered at the third attempt, once
    assert (dead[never]["attempts"], len(merchant.started[never]), merchant.answered[never]) == (
        MAX_ATTEMPTS, MAX_ATTEMPTS, 0)
    assert "TimeoutError" in dead[never]["last_error"], dead[never]["last_error"]
    assert (came[slow]["attempts"], len(merchant.started[slow]), merchant.answered[slow]) == (
        SLOW_ATTEMPTS + 1, SLOW_ATTEMPTS + 1, 1)
    others = [f"deposit:{d}:release_goods" for d in ("dep_slow", "dep_never")]
    assert {k: merchant.answered[k] for k in others} == dict.fromkeys(others, 1)
    # the schedule: each retry the timeout plus the backoff after n failures (half its ceiling
    # fixed, half jittered) after the previous one, give or take the delivery loop's turn
    gaps = {k: [b - a - REQUEST_TIMEOUT_S for a, b in zip(merchant.started[k], merchant.started[k][1:], strict=False)]
            for k in (never, slow)}
    for key, waits in gaps.items():
        for n, wait in enumerate(waits, start=1):
            ceiling = backoff_ceiling_s(n)
            # give or take this busy process's turn: the stub runs in one of its threads
            assert ceiling / 2 - 0.1 <= wait <= ceiling + 2.0, (key, n, round(wait, 2), ceiling)
    print(f"\nquick effects {len(quick_keys)} delivered {quick_done - first_slow:.1f} s after the first slow request; "
          f"most requests open {merchant.most_open} (bound {CONCURRENCY}); retries after the timeout "
          f"{ {k: [round(w, 2) for w in v] for k, v in gaps.items()} }; requests per slow key "
          f"{ {k: len(merchant.started[k]) for k in (never, slow)} }, answered "
          f"{ {k: merchant.answered[k] for k in (never, slow)} }")
