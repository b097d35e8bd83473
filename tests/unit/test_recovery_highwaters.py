"""The exactly-once recovery's highwater read (app/worker/recovery.py) against a fake consumer: it
must end, one way or the other, when the broker does not answer.

Faust runs ``_build_highwaters`` inside ``Recovery._wait(..., timeout=broker_request_timeout)``;
when that timeout passes, mode's ``wait_first`` reports the service as stopped, ``_wait`` raises
ServiceStopped and ``_restart_recovery`` leaves its loop for good, with the app still marked in
recovery (so the worker's stall watchdog never fires): a read that does not end within it leaves the
worker alive and idle for ever. The read has its own, shorter, bound.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from faust.tables.recovery import Recovery, ServiceStopped
from faust.types import TP
from mode import Service
from mode.utils.locks import Event

from app.worker import recovery


class StuckConsumer:
    """A read_committed consumer of a partition whose leader is away: offsets known, no fetch
    ever returns and the position never moves."""

    def __init__(self, **_: Any) -> None:
        self.positions: dict[TopicPartition, int] = {}
        self.stopped = False

    async def start(self) -> None: ...

    async def stop(self) -> None:
        self.stopped = True

    def assign(self, tps: list[TopicPartition]) -> None: ...

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 100)

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    async def getmany(self, *tps: TopicPartition, timeout_ms: int = 0) -> dict[TopicPartition, list[Any]]:
        await asyncio.sleep(timeout_ms / 1000)  # as aiokafka's: waits for a fetch that never comes
        return {}

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]


async def test_a_highwater_read_the_broker_never_answers_ends_with_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    consumers: list[StuckConsumer] = []

    def make(**options: Any) -> StuckConsumer:
        consumers.append(StuckConsumer(**options))
        return consumers[-1]

    monkeypatch.setattr(recovery, "AIOKafkaConsumer", make)
    with pytest.raises(recovery.HighwaterTimeout, match=r"t\[0\]"):
        await recovery.last_committed_offsets("127.0.0.1:1", [TP("t", 0)], timeout_s=0.3)
    assert consumers and consumers[0].stopped


async def test_faust_ends_its_recovery_for_good_on_the_wait_timeout() -> None:
    """Why the bound matters: what Faust does when a recovery step outlasts its timeout."""
    service = Service()
    waiter: Any = type("W", (), {})()
    waiter.wait_first = service.wait_first
    waiter.signal_recovery_start = Event()

    async def never() -> None:
        await Event().wait()

    with pytest.raises(ServiceStopped):  # _restart_recovery: ``except ServiceStopped: break``
        await Recovery._wait(waiter, never(), timeout=0.05)


def test_the_read_is_bounded_below_faust_s_wait() -> None:
    assert recovery.read_timeout(90.0) < 90.0
    assert recovery.read_timeout(10.0) < 10.0
