"""`orderly dev --brokers N --workers M` as the supervisor lays it out, before anything starts:
the cluster's nodes and their quorum, the replication the topics get, the workers' names, state
folders and metrics ports (tests/chaos/test_production_shape.py runs that shape for real)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from app.settings import SettingsError, dev_settings
from app.stack.kafka import KafkaCluster
from app.supervisor import ShapeChangedError, Stack
from topics.catalog import catalog


def test_three_brokers_three_workers(tmp_path: Path) -> None:
    stack = Stack(dev_settings({"ORDERLY_DATA_DIR": str(tmp_path), "ORDERLY_KAFKA": "127.0.0.1:29092",
                                "ORDERLY_INGEST_PORT": "28080"}), brokers=3, workers=3)
    assert isinstance(stack.kafka, KafkaCluster)
    assert stack.settings.kafka_bootstrap == "127.0.0.1:29092,127.0.0.1:29093,127.0.0.1:29094"
    assert (stack.settings.replication_factor, stack.settings.min_insync) == (3, 2)
    assert [c.name for c in stack.children] == ["ingest", "worker-1", "worker-2", "worker-3", "projector",
                                                "effects", "fetcher", "admin"]
    ports = [c.metrics_port for c in stack.children]
    assert ports == [28081, 28082, 28083, 28084, 28085, 28086, 28087, 28088]  # never the webhook or admin port
    dirs = [c.env.get("ORDERLY_DATA_DIR") for c in stack.workers]
    assert dirs[0] == str(tmp_path) and dirs[1:] == [str(tmp_path / "worker-2"), str(tmp_path / "worker-3")]
    # static members of the group, each under its own id (a restarted worker takes its partitions back at once)
    assert [c.env["ORDERLY_WORKER_INSTANCE_ID"] for c in stack.workers] == ["worker-1", "worker-2", "worker-3"]
    assert {c.env["ORDERLY_WORKER_INSTANCE_ID"] for c in stack.children if c not in stack.workers} == {""}
    # the sinks are static members of their groups too, one id each; the rest join none
    assert {c.name: c.env["ORDERLY_INSTANCE_ID"] for c in stack.children if c.env["ORDERLY_INSTANCE_ID"]} == {
        "projector": "projector-1", "effects": "effects-1", "fetcher": "fetcher-1"}
    assert {c.env["ORDERLY_KAFKA"] for c in stack.children} == {stack.settings.kafka_bootstrap}
    assert {c.env["ORDERLY_REPLICATION_FACTOR"] for c in stack.children} == {"3"}

    controllers = stack.kafka.controllers
    assert [c.node_id for c in controllers] == [101, 102, 103] and [n.node_id for n in stack.kafka.nodes] == [1, 2, 3]
    voters = {c.node_id: c.controller_port for c in controllers}
    quorum = ",".join(f"{i}@127.0.0.1:{p}" for i, p in sorted(voters.items()))
    for node in stack.kafka.nodes:
        props = dict(line.split("=", 1) for line in node._properties().splitlines() if "=" in line)
        assert (props["process.roles"], props["node.id"]) == ("broker", str(node.node_id))
        assert props["controller.quorum.voters"] == quorum
        assert props["listeners"] == f"PLAINTEXT://127.0.0.1:{node.port}"  # no controller listener of its own
        for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                    "default.replication.factor", "share.coordinator.state.topic.replication.factor"):
            assert props[key] == "3", key
        for key in ("transaction.state.log.min.isr", "min.insync.replicas", "share.coordinator.state.topic.min.isr"):
            assert props[key] == "2", key
        assert props["broker.session.timeout.ms"] == "1500"
        assert node._format_args() == []  # the voters come from the properties, not --standalone
    for controller in controllers:
        props = dict(line.split("=", 1) for line in controller._properties().splitlines() if "=" in line)
        assert (props["process.roles"], props["controller.quorum.voters"]) == ("controller", quorum)
        assert props["listeners"] == f"CONTROLLER://127.0.0.1:{controller.controller_port}"
        assert props["broker.session.timeout.ms"] == "1500"  # the controllers fence a silent broker
        assert props["min.insync.replicas"] == "2"  # Kafka 4 makes the controllers' value the cluster's default
    assert {c.controller_port for c in controllers}.isdisjoint(n.port for n in stack.kafka.nodes)

    again = Stack(dev_settings({"ORDERLY_DATA_DIR": str(tmp_path), "ORDERLY_KAFKA": "127.0.0.1:29092"}), brokers=3)
    assert isinstance(again.kafka, KafkaCluster)
    assert {c.node_id: c.controller_port for c in again.kafka.controllers} == voters  # the quorum is kept
    with pytest.raises(ValueError, match="cluster of 3 Kafka brokers, not 5"):
        KafkaCluster(tmp_path / "kafka-3", 5)


def test_one_broker_one_worker_stays_as_it_was(tmp_path: Path) -> None:
    stack = Stack(dev_settings({"ORDERLY_DATA_DIR": str(tmp_path), "ORDERLY_KAFKA": "127.0.0.1:29092"}))
    assert [c.name for c in stack.children] == ["ingest", "worker", "projector", "effects", "fetcher", "admin"]
    assert stack.child("worker").env["ORDERLY_WORKER_INSTANCE_ID"] == "worker-1"
    assert stack.settings.kafka_bootstrap == "127.0.0.1:29092"
    assert (stack.settings.replication_factor, stack.settings.min_insync) == (1, 1)
    props = dict(line.split("=", 1) for line in stack.brokers[0]._properties().splitlines() if "=" in line)
    assert props["offsets.topic.replication.factor"] == "1" and props["min.insync.replicas"] == "1"
    assert "controller.quorum.voters" not in props and stack.brokers[0]._format_args() == ["--standalone"]


def test_the_catalog_takes_the_min_insync_setting() -> None:
    assert {s.config["min.insync.replicas"] for s in catalog("o", 3, 3)} == {"2"}
    assert {s.config["min.insync.replicas"] for s in catalog("o", 3, 5, 3)} == {"3"}
    assert {s.config["min.insync.replicas"] for s in catalog("o", 3, 1)} == {"1"}
    with pytest.raises(ValueError, match="exceeds the replication factor"):
        catalog("o", 3, 2, 3)


@pytest.mark.parametrize("argv", [["dev", "--brokers", "0"], ["dev", "--workers", "two"]])
def test_dev_refuses_a_shape_that_is_not_a_count(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[1]}:" in err and ("at least 1" in err or "a whole number" in err), err


def test_a_data_dir_keeps_its_number_of_kafka_nodes(tmp_path: Path) -> None:
    """The tables hold the sinks' positions in one cluster's topics: next to a fresh cluster of
    another shape they would skip its first records, so the stack refuses, saying what to do."""
    settings = dev_settings({"ORDERLY_DATA_DIR": str(tmp_path), "ORDERLY_KAFKA": "127.0.0.1:29092"})
    Stack(settings, brokers=3)._check_shape()
    Stack(settings, brokers=3)._check_shape()  # the same shape again: fine
    with pytest.raises(ShapeChangedError, match=r"stack of 3 Kafka node\(s\), not 1: .*--brokers 3"):
        Stack(settings)._check_shape()
    older = tmp_path / "older"
    (older / "kafka" / "log").mkdir(parents=True)  # a data dir from before shape.json: one node
    with pytest.raises(ShapeChangedError, match="not 3"):
        Stack(settings.with_overrides(data_dir=older), brokers=3)._check_shape()
    Stack(settings.with_overrides(data_dir=older))._check_shape()


@pytest.mark.parametrize(("argv", "shape"), [(["dev"], (1, 1)), (["dev", "--brokers", "3", "--workers", "2"], (3, 2))])
def test_dev_runs_the_shape_it_is_asked_for(argv: list[str], shape: tuple[int, int],
                                             monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    asked: list[tuple[int, int]] = []

    def run_dev(settings: object, brokers: int = 1, workers: int = 1, made: object = None) -> int:
        asked.append((brokers, workers))
        return 0

    monkeypatch.setattr("app.supervisor.run_dev", run_dev)
    monkeypatch.setenv("ORDERLY_DATA_DIR", str(tmp_path))
    assert main(argv) == 0
    assert asked == [shape]


@pytest.mark.parametrize(("replicas", "insync", "refusal"), [
    ("3", "4", "no write could ever be acknowledged"),
    ("3", "3", "losing any one broker would stop every write"),
    ("2", "2", "use at most 1"),
])
def test_min_insync_replicas_must_leave_a_broker_to_lose(replicas: str, insync: str, refusal: str) -> None:
    with pytest.raises(SettingsError, match=refusal):
        dev_settings({"ORDERLY_REPLICATION_FACTOR": replicas, "ORDERLY_MIN_INSYNC_REPLICAS": insync})


def test_min_insync_replicas_accepted() -> None:
    assert dev_settings({"ORDERLY_REPLICATION_FACTOR": "3"}).min_insync == 2
    assert dev_settings({"ORDERLY_REPLICATION_FACTOR": "5", "ORDERLY_MIN_INSYNC_REPLICAS": "3"}).min_insync == 3
    assert dev_settings({}).min_insync == 1


def test_a_static_member_id_may_name_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "c0ffee12")
    assert dev_settings({"ORDERLY_WORKER_INSTANCE_ID": "worker-{hostname}"}).worker_member == "worker-c0ffee12"
    assert dev_settings({"ORDERLY_WORKER_INSTANCE_ID": "worker-2"}).worker_member == "worker-2"
    assert dev_settings({}).worker_member is None  # unset: a dynamic member, as before
    with pytest.raises(SettingsError, match="ORDERLY_WORKER_INSTANCE_ID"):
        dev_settings({"ORDERLY_WORKER_INSTANCE_ID": "worker 1"})
    assert dev_settings({"ORDERLY_INSTANCE_ID": "projector-{hostname}"}).instance_member == "projector-c0ffee12"
    assert dev_settings({}).instance_member is None
    with pytest.raises(SettingsError, match="ORDERLY_INSTANCE_ID"):
        dev_settings({"ORDERLY_INSTANCE_ID": "projector/1"})
