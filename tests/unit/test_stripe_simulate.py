"""`orderly simulate --check --gateway stripe`: Stripe's histories (retries up to three days, lost
events, duplicates, thin events, fetched answers) through the worker's own planner, against an
oracle written from Stripe's documents (app/simulator/stripe_history.py)."""

from __future__ import annotations

import pytest

from app.core import stripe as core
from app.simulator import check, stripe_history, truths
from app.simulator.oracle import Outcome


def test_stripe_histories_end_where_the_oracle_says() -> None:
    report = check.check_gateway("stripe", 400, seed=7)
    assert report.histories == 400 and report.deliveries > 2_000
    assert [why for _, _, why in report.mismatches] == []


def test_a_reducer_that_ranks_a_failure_before_the_retry_step_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(core.RANK, "payment_intent.payment_failed", 0)
    report = check.check_gateway("stripe", 2_000, seed=0, keep=1)
    assert report.mismatches and "status" in " ".join(report.mismatches[0][2])


def test_a_reducer_that_lets_a_refund_snapshot_win_a_tie_with_its_charge_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refunds_win(charges: list[core.Latest], refunds: list[core.Latest]) -> int:
        return sum(s.obj.amount or 0 for s in refunds if s.obj.status in core.REFUND_COUNTED) if refunds else \
            sum(s.obj.amount_refunded or 0 for s in charges)
    monkeypatch.setattr(core, "refunded", refunds_win)
    report = check.check_gateway("stripe", 1_300, seed=7_800, keep=1)  # holds lost refund events in a tie
    assert report.mismatches and "amount_refunded_minor" in " ".join(report.mismatches[0][2])


def test_histories_hold_what_the_documents_describe() -> None:
    histories = [truths.make("stripe", seed) for seed in range(400)]
    sources = {d.source for h in histories for d in h.deliveries}
    assert sources == {"webhook", "fetch"}
    assert any(d.fact.get("thin") for h in histories for d in h.deliveries)  # thin events
    assert any(len(h.deliveries) < len(h.events) for h in histories)  # events given up after three days
    assert any(sum(d.event == i for d in h.deliveries) > 1 for h in histories for i in range(len(h.events)))
    parked = [stripe_history.oracle_with(Outcome)(h).parked for h in histories]
    assert any(p and max(p.values()) > 0 for p in parked)  # thin events no API answered stay parked
