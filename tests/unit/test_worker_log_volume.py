"""The worker's log under one kind of bad input repeated: a bounded number of lines a minute per
gateway and reason, the rest counted (app/worker/batch.py report)."""

from __future__ import annotations

import logging

import pytest

from app.core.dispatch import BatchPlan
from app.logs import SampledLog
from app.metrics import WorkerMetrics
from app.worker.batch import LOGGED_PER_MINUTE, log, report
from topics.records import Decision


def parked(n: int, error: str, gateway: str = "paymos") -> Decision:
    return Decision(f"d{n}", gateway, f"inv_{n}", "parked", 0, n, error=error)


def test_a_thousand_records_of_one_kind_write_five_lines(caplog: pytest.LogCaptureFixture) -> None:
    metrics = WorkerMetrics()
    now = [0.0]
    sampled = SampledLog(log, first=LOGGED_PER_MINUTE, window_s=60.0, clock=lambda: now[0],
                         on_suppressed=lambda _key: metrics.log_suppressed.labels(log.name).inc())
    reorg = "change out of a terminal state waits for its reorg"
    plan = BatchPlan(errors=[parked(i, reorg) for i in range(1000)] + [parked(1000, "another reason")],
                     set_aside=[("card", "not JSON")] * 50)
    with caplog.at_level(logging.INFO, logger=log.name):
        report(plan, metrics, sampled)
    lines = [r for r in caplog.records if r.name == log.name]
    assert [r.levelno for r in lines].count(logging.WARNING) == LOGGED_PER_MINUTE + 1  # 5 of one kind, 1 other
    assert [r.levelno for r in lines].count(logging.ERROR) == LOGGED_PER_MINUTE  # set aside: 5 of 50
    assert [getattr(r, "delivery_id", None) for r in lines[:LOGGED_PER_MINUTE]] == [f"d{i}" for i in range(5)]
    assert metrics.registry.get_sample_value("orderly_log_lines_suppressed_total", {"logger": log.name}) == 995 + 45
    # every record still counted where an operator looks
    assert metrics.registry.get_sample_value("orderly_worker_errors_total", {"gateway": "paymos"}) == 1001
    assert metrics.registry.get_sample_value("orderly_set_aside_total", {"stage": "worker", "gateway": "card"}) == 50

    caplog.clear()
    now[0] = 61.0  # the minute is over: the count of what was not written is said once
    with caplog.at_level(logging.INFO, logger=log.name):
        report(BatchPlan(errors=[parked(2000, reorg)]), metrics, sampled)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "995" in text and "45" in text, text
    assert sum(1 for r in caplog.records if r.getMessage().startswith("paymos inv_2000")) == 1
