"""The overview's consumer lag when Kafka cannot be asked: viewers are told the failure's kind, never
Kafka's text (it names hosts and addresses); the log has the text, once while it stays the same
(app/admin/context.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

from app.admin import context
from app.admin.context import Admin
from app.settings import dev_settings

HOSTS = "Unable to bootstrap from [('kafka-7.payments.internal', 9092, <AddressFamily.AF_UNSPEC: 0>)]"


@pytest.mark.asyncio
async def test_a_failed_lag_measure_tells_viewers_its_kind_and_logs_its_text_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    admin = Admin(dev_settings({"ORDERLY_ADMIN_TOKEN": "a-break-glass-token"}))
    other = KafkaTimeoutError("metadata of orderly.raw not received from kafka-7.payments.internal:9092")
    outcomes: list[Any] = [KafkaConnectionError(HOSTS), KafkaConnectionError(HOSTS), other,
                           {"groups": [{"group": "projector", "lag": 3}], "error": None},
                           KafkaConnectionError(HOSTS)]
    seen: list[dict[str, Any]] = []
    done = asyncio.Event()

    async def measure_lag() -> dict[str, Any]:
        if len(seen) == len(outcomes):
            done.set()
            await asyncio.Event().wait()
        outcome = outcomes[len(seen)]
        seen.append(admin.lag)
        if isinstance(outcome, Exception):
            raise outcome
        return dict(outcome)

    async def no_clients() -> None:
        return None

    monkeypatch.setattr(admin, "measure_lag", measure_lag)
    monkeypatch.setattr(admin, "_close_lag_clients", no_clients)
    monkeypatch.setattr(context, "LAG_INTERVAL_S", 0.0)
    with caplog.at_level(logging.WARNING, logger="orderly.admin"):
        task = asyncio.create_task(admin._measure_lag_forever())
        await asyncio.wait_for(done.wait(), 5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    after_failures = seen[1:4]  # the lag as the overview showed it after each failure
    assert [lag["error"] for lag in after_failures] == [
        "KafkaConnectionError; the admin's log says more"] * 2 + ["KafkaTimeoutError; the admin's log says more"]
    assert admin.lag == {"groups": [{"group": "projector", "lag": 3}],
                         "error": "KafkaConnectionError; the admin's log says more"}  # the last groups kept
    assert "kafka-7" not in repr([*seen, admin.lag])
    logged = [r.getMessage() for r in caplog.records if "consumer lag not measured" in r.getMessage()]
    # twice the same text: logged once; another text is logged, and after a success the first again
    first = f"consumer lag not measured: KafkaConnectionError: {KafkaConnectionError(HOSTS)}"
    assert logged == [first, f"consumer lag not measured: KafkaTimeoutError: {other}", first]
