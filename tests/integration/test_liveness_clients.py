"""The worker's liveness clients after a start that did not finish: the next reading builds them
again (a kept half-started pair answered "Unable to get cluster metadata" for ever, which silenced
the stall check and the lag gauge after a broker incident)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka.errors import GroupCoordinatorNotAvailableError, KafkaError

from app.liveness import Liveness
from app.stack.kafka import KafkaBroker
from app.stack.process import free_port
from tests.support import make_settings
from topics.admin import ensure_topics
from topics.catalog import catalog, names


async def test_a_cancelled_or_failed_start_is_tried_again(kafka: KafkaBroker) -> None:
    namespace = f"live{uuid.uuid4().hex[:8]}"
    settings = make_settings(kafka.bootstrap, "postgresql://unused@127.0.0.1:1/x", namespace)
    await ensure_topics(kafka.bootstrap, catalog(namespace, settings.partitions))
    raw = names(namespace).raw
    liveness = Liveness(kafka.bootstrap, f"{namespace}-worker", 60.0)
    try:
        with pytest.raises(TimeoutError):  # the lag timer's deadline ends the first start half-way
            await asyncio.wait_for(liveness.group_lag(raw), 0.001)
        assert (liveness._consumer, liveness._admin) == (None, None)  # nothing half-started kept
        deadline = time.monotonic() + 30
        while True:  # built again, and it reaches the broker (a fresh broker's group coordinator comes up)
            try:
                assert await liveness.group_lag(raw) == 0
                break
            except GroupCoordinatorNotAvailableError:
                assert time.monotonic() < deadline, "the liveness clients never reached the broker"
                await asyncio.sleep(0.5)
    finally:
        await liveness.close()

    nobody = Liveness(f"127.0.0.1:{free_port()}", f"{namespace}-worker", 60.0)  # a broker that is away
    with pytest.raises(KafkaError):
        await nobody.group_lag(raw)
    assert (nobody._consumer, nobody._admin) == (None, None)  # nothing half-started kept
    await nobody.close()
