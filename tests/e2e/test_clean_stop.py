"""A process stopped with SIGTERM leaves its consumer groups on the way out (issue #47): the member
is gone from the group the moment the process exits, so a restarted one is given the partitions at
once. Before, SIGTERM ended the asyncio processes on the spot; their dead member stayed in the group
until its 10 s session ran out, and the restarted projector waited for it (8-9 s to a row)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import DescribeGroupsRequest_v3, DescribeGroupsResponse_v3

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings

STOPPED = ("projector", "effects", "fetcher")


@pytest.fixture
def pipe(kafka: KafkaBroker, postgres: PostgresServer, tmp_path: Path) -> Iterator[Running]:
    # a card API (never asked: nothing parks here) so that the fetcher reads orderly.fetch in its group
    s = make_settings(kafka.bootstrap, postgres.dsn, f"cs{uuid.uuid4().hex[:8]}", api_urls={"card": "http://127.0.0.1:9"})
    with running_pipeline(s, tmp_path) as running:
        yield running


async def members(bootstrap: str, namespace: str) -> dict[str, int]:
    """Each consumer group of the namespace (but the worker's, which Faust runs) and its members now,
    as the broker's group coordinator knows them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        groups = [g[0] for g in await admin.list_consumer_groups()
                  if g[0].startswith(f"{namespace}-") and not g[0].startswith(f"{namespace}-worker")]
        described = await admin.describe_consumer_groups(groups)
    finally:
        await admin.close()
    return {group[1]: len(group[5]) for response in described for group in response.groups}


@pytest.mark.timeout(120)
async def test_sigterm_leaves_the_group_before_the_process_exits(pipe: Running,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # aiokafka 0.14 decodes DescribeGroups v3 answers with v2's schema (a typo in its protocol table),
    # and Kafka 4 answers v3 (KIP-896 removed v0): the right schema, for this test process only
    monkeypatch.setattr(DescribeGroupsRequest_v3, "RESPONSE_TYPE", DescribeGroupsResponse_v3)
    bootstrap, ns = pipe.settings.kafka_bootstrap, pipe.settings.namespace
    deadline = time.monotonic() + 60
    while True:  # the projector, the quarantine sink, the effects recorder, the fetcher's requests
        sinks = await members(bootstrap, ns)
        if len(sinks) >= 4 and all(n >= 1 for n in sinks.values()):
            break
        assert time.monotonic() < deadline, f"not every sink joined its group: {sinks}"
        await asyncio.sleep(0.2)
    # kill -USR1: each process logs where its tasks wait, and goes on (docs/operations.md); the
    # worker's handler is set once it runs (a deposit decided and projected)
    await pipe.canary("dep_usr1", timeout=60)
    for name in ("worker", *STOPPED):
        log = pipe.pipeline.logs / f"{name}.log"
        before = log.stat().st_size
        os.kill(pipe.pipeline.procs[name].pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while b"orderly.process: task " not in log.read_bytes()[before:]:
            assert time.monotonic() < deadline, f"{name} logged no task after SIGUSR1"
            await asyncio.sleep(0.1)
        assert pipe.pipeline.procs[name].poll() is None, f"{name} ended on SIGUSR1"
    for name in STOPPED:
        pipe.pipeline.terminate(name)  # SIGTERM, and wait for the exit
    after = await members(bootstrap, ns)
    assert {g: after[g] for g in sinks} == dict.fromkeys(sinks, 0), (sinks, after)
