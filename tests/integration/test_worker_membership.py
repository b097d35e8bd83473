"""The worker as a static member of its consumer group (ORDERLY_WORKER_INSTANCE_ID), on the started
broker: two workers given the same id do not leave one of them idle in silence; a worker lost for good
has its partitions decided by the other well before the group's 10 s session would have let it: the
other removes it from the group once its alive records stop (app/worker/peers.py; how soon:
`python -m bench restart --scenario gone`). (A worker killed and restarted under its id:
tests/chaos/test_worker_kill9.py and test_production_shape.py.)"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from app.bootstrap import prepare
from app.group_session import broker_group_configs, refusal, session_refusal
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from app.worker.exits import FAILED_EXIT_CODE
from tests.pg_events import deposit
from tests.pipeline import Pipeline, Running, running_pipeline
from tests.support import decided_at, make_settings, read_topic
from topics.catalog import names

# The group's session (ORDERLY_SESSION_TIMEOUT_MS' default). A lost worker's partitions decided well
# within it of the kill were moved by the other worker's removal of it, not by the session's end.
SESSION_S = 10.0
PROBES = 24  # pg deposits, each on the partition of its id: all 3 partitions hit but with odds of 3·(2/3)^24


@pytest.mark.parametrize("web", ["no web port", "a metrics port each"])
async def test_two_workers_with_one_static_id_end_with_a_reason(kafka: KafkaBroker, postgres: PostgresServer,
                                                               namespace: str, tmp_path: Path, web: str) -> None:
    settings = make_settings(kafka.bootstrap, postgres.dsn, namespace, data_dir=tmp_path / "one")
    await prepare(settings)
    pipeline = Pipeline(settings, tmp_path)
    # Faust names a worker by its web URL: with a metrics port each, the two have different ones
    ports = ({"ORDERLY_METRICS_PORT": str(spare_port())}, {"ORDERLY_METRICS_PORT": str(spare_port())}) \
        if web != "no web port" else ({}, {})
    pipeline.start("worker", ORDERLY_WORKER_INSTANCE_ID="same", **ports[0])
    try:
        # the first has joined when it logs its partitions
        deadline = time.monotonic() + 60
        while "Assigned partitions" not in pipeline.log("worker"):
            assert time.monotonic() < deadline, pipeline.log("worker")[-3000:]
            pipeline.assert_alive()
            await asyncio.sleep(0.2)
        pipeline.start("worker2", "worker", ORDERLY_WORKER_INSTANCE_ID="same",
                       ORDERLY_DATA_DIR=str(tmp_path / "two"), **ports[1])
        # The coordinator gives the second the first one's member (its assignment too) and forgets
        # the first, which finds itself a new member at its next join and exits. With different
        # URLs, Faust also refuses the first one's assignment in the second, whose membership ends:
        # it exits too, instead of idling. Either way no two workers go on sharing the id.
        expected = {"worker", "worker2"} if web != "no web port" else {"worker"}
        ended: dict[str, int] = {}
        while set(ended) < expected or not ended:
            assert time.monotonic() < deadline + 60, {n: pipeline.log(n)[-2000:] for n in pipeline.procs}
            ended = {name: code for name, proc in pipeline.procs.items() if (code := proc.poll()) is not None}
            await asyncio.sleep(0.2)
        for name, code in ended.items():
            assert code == FAILED_EXIT_CODE, pipeline.log(name)[-3000:]
            assert "ORDERLY_WORKER_INSTANCE_ID=same" in pipeline.log(name), pipeline.log(name)[-3000:]
    finally:
        pipeline.stop()


async def _until(pipeline: Pipeline, done: Any, what: str, limit_s: float = 90) -> None:
    deadline = time.monotonic() + limit_s  # a bound on a hung test, not a timing claim
    while not done():
        assert time.monotonic() < deadline, (what, {n: pipeline.log(n)[-2500:] for n in pipeline.procs})
        pipeline.assert_alive()
        await asyncio.sleep(0.2)


async def _stable_members(bootstrap: str, group: str, pipeline: Pipeline, limit_s: float = 60.0) -> list[str]:
    """The group's member ids once the coordinator calls it Stable (its state, read from the broker)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + limit_s  # a bound on a hung test, not a timing claim
        while True:
            [described] = await admin.describe_consumer_groups([group])
            _, _, state, _, _, members, *_ = described.groups[0]
            if state == "Stable":
                return sorted(str(m[0]) for m in members)
            assert time.monotonic() < deadline, (state, members)
            pipeline.assert_alive()
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def test_rebalances_of_a_static_group_end_no_worker(kafka: KafkaBroker, postgres: PostgresServer,
                                                          namespace: str, tmp_path: Path) -> None:
    """The new-member check must not fire on the group's ordinary events: another worker joining,
    leaving for good (its session expires), and being killed and started again under its id."""
    settings = make_settings(kafka.bootstrap, postgres.dsn, namespace, data_dir=tmp_path / "one",
                             processing_guarantee="exactly_once")
    await prepare(settings)
    pipeline = Pipeline(settings, tmp_path)

    def assigned(name: str) -> int:
        return pipeline.log(name).count("Assigned partitions")

    pipeline.start("worker")
    try:
        await _until(pipeline, lambda: assigned("worker") >= 1, "worker assigned")
        pipeline.start("worker2", "worker", ORDERLY_DATA_DIR=str(tmp_path / "two"))
        await _until(pipeline, lambda: assigned("worker2") >= 1 and assigned("worker") >= 2
                     and "watching the other workers" in pipeline.log("worker2"), "worker2 joined")
        pipeline.terminate("worker2")  # for good: a static member leaves no group, its session expires
        before = assigned("worker")
        await _until(pipeline, lambda: assigned("worker") > before, "worker2's partitions back to worker")
        # a clean stop said so on the workers topic: left to its session, not removed as a lost worker
        said = [orjson.loads(r.value) for r in await read_topic(kafka.bootstrap, names(settings.namespace).workers)
                if r.key == b"worker2"]
        assert said and said[-1].get("stopping") is True, said[-3:]
        assert "removed from group" not in pipeline.log("worker"), pipeline.log("worker")[-3000:]
        pipeline.start("worker2", "worker", ORDERLY_DATA_DIR=str(tmp_path / "two"))
        await _until(pipeline, lambda: assigned("worker2") >= 2, "worker2 joined again")
        pipeline.kill("worker")
        mark = len(pipeline.log("worker"))
        pipeline.start("worker")  # under its id, within the session
        await _until(pipeline, lambda: "Assigned partitions" in pipeline.log("worker")[mark:], "worker back")
        # A positive signal instead of sleeping past a session timeout: the broker's own view of the
        # group. Had the restart joined as a new member, the killed one would still be a member until
        # its session expired (then a rebalance, and the new-member check's exit). The group holds
        # exactly the two static members, one per instance id, and is stable: nothing is left to expire.
        group = f"{settings.namespace}-worker"
        members = await _stable_members(kafka.bootstrap, group, pipeline)
        assert sorted(m.split("-", 1)[0] for m in members) == ["worker", "worker2"], members
        for name in ("worker", "worker2"):
            assert "as a new member" not in pipeline.log(name), pipeline.log(name)[-3000:]
            assert "membership of its consumer group ended" not in pipeline.log(name), pipeline.log(name)[-3000:]
        pipeline.assert_alive()
    finally:
        pipeline.stop()


@pytest.fixture(params=["at_least_once", "exactly_once"])
def two_workers(request: pytest.FixtureRequest, kafka: KafkaBroker, postgres: PostgresServer, namespace: str,
                tmp_path: Path) -> Iterator[Running]:
    # the default session, as on a stock broker (which refuses one under 6 s)
    settings = make_settings(kafka.bootstrap, postgres.dsn, namespace, processing_guarantee=request.param,
                             session_timeout_s=SESSION_S)
    with running_pipeline(settings, tmp_path) as running:
        running.pipeline.start("worker2", "worker", ORDERLY_DATA_DIR=str(tmp_path / "two"))
        yield running


def _owned(log: str) -> int:
    """The partitions of the raw topic a worker was given at its last assignment (0 before any)."""
    found = re.findall(r"Assigned partitions: (\d+) of", log)
    return int(found[-1]) if found else 0


async def test_a_worker_lost_for_good_has_its_partitions_decided_by_the_other(two_workers: Running) -> None:
    pipe, pipeline = two_workers, two_workers.pipeline
    await _until(pipeline, lambda: _owned(pipeline.log("worker2")) >= 1 and _owned(pipeline.log("worker")) >= 1
                 and _owned(pipeline.log("worker")) + _owned(pipeline.log("worker2")) == pipe.settings.partitions,
                 "the two workers sharing the partitions")
    probes = [f"lost{uuid.uuid4().hex[:8]}{i}" for i in range(PROBES)]
    await pipe.correlate(probes)  # both deciding (the group settled), and the probes' mappings known
    mark = len(pipeline.log("worker"))
    pipeline.kill("worker2")  # and not started again
    killed = time.time()
    acked: dict[str, float] = {}  # delivery id -> when the ingest acknowledged it
    for dep in probes:
        (answer,) = await pipe.post("pg", deposit(dep, 3, "settled"))
        acked[answer["delivery_id"]] = time.time()
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = $2 FROM pg_deposits WHERE pg_deposit_id = ANY($1) "
                                             "AND status = 'settled'", probes, len(probes)), timeout=90)
    # each probe from its acknowledgement (or the kill, if later) to its committed decision, by the
    # decision record's time: not the posts before it, nor the way on to the read model
    decided = await decided_at(pipe.settings.kafka_bootstrap, names(pipe.settings.namespace).decisions)
    assert set(acked) <= set(decided), set(acked) - set(decided)
    decided_s = max(decided[d] - max(killed, at) for d, at in acked.items())
    after = pipeline.log("worker")[mark:]
    # the survivor was given every partition, the killed one's too, and decided a probe on each
    assert _owned(after) == pipe.settings.partitions, after[-3000:]
    assert decided_s < SESSION_S - 3, (decided_s, after[-3000:])
    assert "removed from group" in after, after[-3000:]  # by the survivor, not by the session's end
    assert "as a new member" not in after, after[-3000:]  # the survivor itself was not expelled


async def test_the_broker_allows_the_groups_session_and_says_so(kafka: KafkaBroker, postgres: PostgresServer,
                                                                 namespace: str) -> None:
    """The embedded broker lowers group.min.session.timeout.ms (Kafka's 6 s would refuse the 3 s
    default): the start-up check reads it and finds the session accepted, a shorter one refused."""
    settings = make_settings(kafka.bootstrap, postgres.dsn, namespace)
    configs = await broker_group_configs(settings)
    assert configs is not None and configs["group.min.session.timeout.ms"] == "1000", configs
    assert await session_refusal(settings) is None
    assert "INVALID_SESSION_TIMEOUT" in (refusal(999, configs) or "")
