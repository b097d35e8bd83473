"""`orderly simulate --check --gateway adyen`: Adyen's lifecycles and retry schedule against the
oracle written from its documents (app/simulator/adyen.py), and a wrong reducer caught by it."""

from __future__ import annotations

import random

import orjson
import pytest
from Adyen.util import is_valid_hmac_notification

from app.core import adyen as core
from app.simulator import adyen as sim
from app.simulator import check, lifecycles, plugins, truths
from app.simulator.deliver import Chaos, retry_after_s, signed_body
from app.simulator.histories import DAY, HOUR, MIN

KEY = "0f" * 32


def test_adyens_retry_schedule_three_quick_retries_then_the_queue_for_30_days() -> None:
    assert sim.RETRIES[:4] == (0, 9_000, 18_000, 27_000)
    assert sim.RETRIES[4] - sim.RETRIES[3] == 2 * MIN and sim.RETRIES[12] - sim.RETRIES[11] == 8 * HOUR
    assert 29 * DAY < sim.RETRIES[-1] <= 30 * DAY


def test_the_histories_hold_what_adyen_sends() -> None:
    codes, reordered = set(), 0
    for seed in range(1, 400):
        h = truths.make("adyen", seed)
        codes |= {orjson.loads(e.body)["eventCode"] for e in h.events}
        firsts = list(dict.fromkeys(d.event for d in h.deliveries))
        reordered += firsts != sorted(firsts)
        assert {d.event for d in h.deliveries} == set(range(len(h.events)))  # Adyen never gives up in 30 days
    assert codes == set(sim.TIE_RANK) and reordered > 50


def test_ten_thousand_histories_match_the_oracle() -> None:
    report = check.check_gateway("adyen", 10_000, 1)
    assert report.histories == 10_000 and not report.mismatches


def test_a_reducer_that_ignores_capture_failed_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    money = core._money

    def wrong(out: core.Reduced, ev: core.AdyenEvent) -> bool:
        return True if ev.code == "CAPTURE_FAILED" else money(out, ev)

    monkeypatch.setattr(core, "_money", wrong)
    report = check.check_gateway("adyen", 500, 1, keep=0)
    assert report.mismatches
    assert any("captured_minor" in line for _, _, why in report.mismatches for line in why)


def test_simulated_requests_are_signed_item_by_item_by_the_deliverer_and_retried_on_adyens_schedule() -> None:
    truth = lifecycles.Truth()
    simulate = plugins.simulator_of("adyen").lifecycles
    assert simulate is not None
    events = simulate(random.Random(3), 60, truth)
    batched = [e for e in events if len(orjson.loads(e.body)["notificationItems"]) > 1]
    assert batched and len(truth.by_gateway["adyen"]) == 60
    signed = orjson.loads(signed_body("adyen", batched[0].body, KEY))
    assert all(is_valid_hmac_notification(w["NotificationRequestItem"], KEY) for w in signed["notificationItems"])
    assert signed_body("card", b"{}", "whsec_x") == b"{}"  # a header-signed gateway's body goes unchanged
    chaos = Chaos(time_scale=1.0)
    assert [retry_after_s("adyen", n, chaos) for n in (1, 2, 3, 4)] == [9.0, 9.0, 9.0, 120.0]
    assert retry_after_s("adyen", 9, chaos) is None and retry_after_s("pg", 1, chaos) == 0.3


def test_the_histories_hold_partial_captures_and_recaptures() -> None:
    several = recaptured = 0
    for seed in range(1, 400):
        bodies = [orjson.loads(e.body) for e in truths.make("adyen", seed).events]
        several += sum(b["eventCode"] == "CAPTURE" and b["success"] == "true" and "reason" not in b for b in bodies) > 1
        recaptured += any(b.get("reason") == "Transaction Recaptured" for b in bodies)
    assert several > 40 and recaptured > 5


def test_a_reducer_that_marks_refunded_against_the_captures_seen_so_far_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    earn = core._earn

    def wrong(out: core.Reduced, ev: core.AdyenEvent) -> None:
        earn(out, ev)
        if out.state == "refunded" and "mark_order_refunded" not in out.earned:
            out.earned.append("mark_order_refunded")

    monkeypatch.setattr(core, "_earn", wrong)
    report = check.check_gateway("adyen", 500, 1, keep=0)
    assert any("mark_order_refunded" in line for _, _, why in report.mismatches for line in why)
