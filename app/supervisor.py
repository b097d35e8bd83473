"""`orderly dev`: the embedded stack on one machine under one supervisor (embedded stack layer).

Kafka and PostgreSQL keep their data in ``.orderly/`` so a restart comes back with it. The Orderly
processes run as child processes and are restarted if they die; Ctrl-C or SIGTERM stops
everything in order: processes first, then Kafka, then PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.bootstrap import prepare
from app.settings import Settings
from app.stack import credentials
from app.stack.kafka import KafkaBroker, KafkaCluster
from app.stack.postgres import PostgresServer
from app.stack.process import (
    CHILD_GROUP,
    PortTakenError,
    child_argv,
    free_port,
    port_accepts,
    port_is_free,
    stop_together,
    wait_until,
)

log = logging.getLogger("orderly.dev")

# The production processes that exist so far, each started as `orderly <name>`.
PROCESSES = ("ingest", "worker", "projector", "effects", "fetcher", "admin")
CHILD_STOP_S = 8.0  # each process's own stop takes 1-3 s; past this it is killed (nothing is lost by that)
STATIC_MEMBERS = ("projector", "effects", "fetcher")  # consumer groups' static members (ORDERLY_INSTANCE_ID)


class ShapeChangedError(RuntimeError):
    """The data directory was made by a stack with another number of Kafka nodes."""


def kafka_port(bootstrap: str) -> int:
    return int(bootstrap.split(",")[0].rsplit(":", 1)[1])


def postgres_port(dsn: str) -> int:
    return urlsplit(dsn).port or 5432


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    metrics_port: int = 0  # 0: the process serves no /metrics
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    started_at: float = field(default=0.0)

    def start(self, host: str) -> None:
        if self.metrics_port and not port_is_free(self.metrics_port, host):
            # A port next to a free one is often the local end of some outgoing connection: Linux
            # hands those out with the other parity. Binding it would kill the process at start,
            # and again at every restart.
            taken, self.metrics_port = self.metrics_port, free_port(host)
            log.warning("%s: metrics port %d is taken; serving /metrics on %d", self.name, taken,
                        self.metrics_port)
        self.env["ORDERLY_METRICS_PORT"] = str(self.metrics_port)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(child_argv(self.argv), env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, process_group=CHILD_GROUP)
        self.started_at = time.monotonic()

    def last_words(self, lines: int = 3) -> str:
        """The end of the child's log: why it died, for the supervisor's warning."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                tail = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return "\n".join(line for line in tail[-lines:] if line.strip())


SERVING_ATTEMPTS = 3  # starts in all of a served child that keeps losing its metrics port as it binds it


def _lost_its_metrics_port(child: Child, host: str) -> bool:
    """Whether ``child``, dead while starting, died binding its metrics port: the port is taken
    now, or its log ends with the bind's error (the connection that held it may be closed by now)."""
    return bool(child.metrics_port) and (not port_is_free(child.metrics_port, host)
                                         or "address already in use" in child.last_words(20).lower())


def _wait_serving(child: Child, port: int, host: str) -> None:
    """Wait until ``child`` accepts connections on ``port``. Its metrics port was free when it
    started, but the local end of an outgoing connection can take it before the child binds it, and
    the child dies: then it starts again (on a fresh one if its own is still taken: Child.start
    moves it), up to SERVING_ATTEMPTS starts in all. A death for another reason is the child's
    own: raised."""
    for attempt in range(1, SERVING_ATTEMPTS + 1):
        proc = child.proc
        assert proc is not None
        try:
            wait_until(lambda: port_accepts(port, host), 30, child.name, lambda: proc.poll() is None)  # noqa: B023
            return
        except RuntimeError:  # it exited while starting
            if attempt == SERVING_ATTEMPTS or not _lost_its_metrics_port(child, host):
                raise
        log.warning("%s exited while starting, its metrics port %d taken meanwhile; starting it again. "
                    "Its log ends:\n%s", child.name, child.metrics_port, child.last_words())
        child.start(host)  # on a fresh metrics port if its own is still taken


class Stack:
    """Kafka + PostgreSQL + the Orderly processes, for `orderly dev` and `orderly demo`."""

    def __init__(self, settings: Settings, processes: tuple[str, ...] = PROCESSES, *, brokers: int = 1,
                 workers: int = 1) -> None:
        if brokers < 1 or workers < 1:
            raise ValueError("a stack has at least one broker and one worker")
        self.data_dir = settings.data_dir.resolve()
        self.postgres = PostgresServer(self.data_dir / "postgres", port=postgres_port(settings.postgres_dsn.reveal()))
        self.kafka: KafkaBroker | KafkaCluster
        if brokers == 1:
            self.kafka = KafkaBroker(self.data_dir / "kafka", port=kafka_port(settings.kafka_bootstrap))
            self.brokers = [self.kafka]
        else:
            # the production shape (DESIGN.md §7): every topic replicated on up to 3 nodes
            self.kafka = KafkaCluster(self.data_dir / f"kafka-{brokers}", brokers,
                                      port=kafka_port(settings.kafka_bootstrap))
            self.brokers = list(self.kafka.nodes)
            replicas = settings.replication_factor if settings.replication_factor > 1 else min(brokers, 3)
            settings = settings.with_overrides(kafka_bootstrap=self.kafka.bootstrap, replication_factor=replicas)
        self.settings = settings
        # a static member id is each worker's own (below): no other child passes one on (replay's workers)
        env = {**os.environ, **settings.to_env(), "ORDERLY_WORKER_INSTANCE_ID": "", "ORDERLY_INSTANCE_ID": ""}
        # One child per process; with more than one worker they are worker-1, worker-2, … in one
        # consumer group, each with a state folder of its own (RocksDB holds a lock per partition).
        # Every process serves /metrics on a port of its own from the ingest port + 1 (never on the
        # webhook port, nor on the admin's, where every route but sign-in and health needs a credential).
        named: list[tuple[str, str, dict[str, str]]] = []
        for name in processes:
            if name == "worker" and workers > 1:
                named += [(f"worker-{i}", name,
                           {"ORDERLY_WORKER_INSTANCE_ID": f"worker-{i}",
                            **({} if i == 1 else {"ORDERLY_DATA_DIR": str(self.data_dir / f"worker-{i}")})})
                          for i in range(1, workers + 1)]
            elif name == "worker":
                named.append((name, name, {"ORDERLY_WORKER_INSTANCE_ID": "worker-1"}))
            elif name in STATIC_MEMBERS:  # back in its groups at once after a restart, a kill -9 included
                named.append((name, name, {"ORDERLY_INSTANCE_ID": f"{name}-1"}))
            else:
                named.append((name, name, {}))
        self.children = [
            Child(child, [sys.executable, "-m", "app.cli", command], {**env, **extra}, self.data_dir / f"{child}.log",
                  metrics_port=settings.ingest_port + 1 + i)
            for i, (child, command, extra) in enumerate(named)
        ]

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    @property
    def workers(self) -> list[Child]:
        return [c for c in self.children if c.name == "worker" or c.name.startswith("worker-")]

    @property
    def ingest_url(self) -> str:
        return f"http://{self.settings.ingest_host}:{self.settings.ingest_port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.settings.admin_host}:{self.settings.admin_port}"

    def describe(self) -> dict[str, Any]:
        host = self.settings.ingest_host
        ingest = next((c for c in self.children if c.name == "ingest"), None)
        return {
            "namespace": self.settings.namespace,
            "ingest_url": self.ingest_url,
            "admin_url": self.admin_url if any(c.name == "admin" for c in self.children) else None,
            "postgres_dsn": self.postgres.dsn,
            "kafka_bootstrap": self.kafka.bootstrap,
            "replication_factor": self.settings.replication_factor,
            "min_insync_replicas": self.settings.min_insync,
            "metrics_url": f"http://{host}:{ingest.metrics_port}/metrics" if ingest else None,
            "process_metrics_urls": {
                c.name: f"http://{host}:{c.metrics_port}/metrics" for c in self.children if c.metrics_port
            },
            "processes": {c.name: {"pid": c.proc.pid if c.proc else None,
                                   "port": {"ingest": self.settings.ingest_port,
                                            "admin": self.settings.admin_port}.get(c.name, c.metrics_port),
                                   "metrics_port": c.metrics_port or None}
                          for c in self.children},
            "postgres": {"pid": self.postgres.proc.pid if self.postgres.proc else None, "port": self.postgres.port},
            "brokers": [{"node_id": b.node_id, "pid": b.pid, "port": b.port} for b in self.brokers],
            # a cluster's dedicated controllers; one node alone is its own controller
            "controllers": [{"node_id": c.node_id, "pid": c.pid, "port": c.controller_port}
                            for c in (self.kafka.controllers if isinstance(self.kafka, KafkaCluster) else [])],
            "workers": [{"name": c.name, "pid": c.proc.pid if c.proc else None, "metrics_port": c.metrics_port}
                        for c in self.workers],
        }

    @property
    def stack_file(self) -> Path:
        return self.data_dir / "stack.json"

    def write_stack_file(self) -> None:
        """stack.json holds the stack's credentials: created mode 0600 (never readable by others, not
        even for a moment) and moved into place whole."""
        draft = self.stack_file.with_name(f".{self.stack_file.name}.{os.getpid()}")
        draft.unlink(missing_ok=True)
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps({**self.describe(), "credentials": credentials.of(self.settings)}, indent=2) + "\n")
        os.replace(draft, self.stack_file)

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.stack_file.unlink(missing_ok=True)  # present only while the stack is up
        names = {c.name for c in self.children}
        for name, variable, port, host in (("ingest", "ORDERLY_INGEST_PORT", self.settings.ingest_port,
                                            self.settings.ingest_host),
                                           ("admin", "ORDERLY_ADMIN_PORT", self.settings.admin_port,
                                            self.settings.admin_host)):
            if name in names and not port_is_free(port, host):
                raise PortTakenError(f"{name}: port {port} on {host} is in use by another process. Stop that "
                                     f"process, or set {variable} to a free port")
        self._check_shape()
        started = time.monotonic()
        self.postgres.start()
        self.kafka.start()
        created, applied = asyncio.run(prepare(self.settings))
        log.info("infrastructure up in %.1fs; topics created %d, migrations applied %d",
                 time.monotonic() - started, len(created), len(applied))
        for child in self.children:
            child.start(self.settings.ingest_host)
        for child in self.children:
            served = {"ingest": (self.settings.ingest_port, self.settings.ingest_host),
                      "admin": (self.settings.admin_port, self.settings.admin_host)}.get(child.name)
            if served is not None:
                _wait_serving(child, *served)
        self.write_stack_file()

    def _check_shape(self) -> None:
        """One data directory, one Kafka cluster: PostgreSQL keeps the sinks' positions in that
        cluster's topics, so the same tables next to another cluster (empty topics, offsets from 0)
        would skip its records."""
        shape = self.data_dir / "shape.json"
        brokers = len(self.brokers)
        made = json.loads(shape.read_text()).get("brokers") if shape.exists() else None
        if made is None and (self.data_dir / "kafka" / "log").exists():
            made = 1  # made before the stack recorded its shape: one node
        if made is not None:
            if made != brokers:
                raise ShapeChangedError(
                    f"{self.data_dir} belongs to a stack of {made} Kafka node(s), not {brokers}: its PostgreSQL "
                    f"holds positions in that cluster's topics. Start it with --brokers {made}, or give this "
                    f"shape its own ORDERLY_DATA_DIR")
        else:
            shape.write_text(json.dumps({"brokers": brokers}) + "\n")

    def supervise_once(self) -> None:
        """Restart a child that died, with a backoff that grows while it keeps dying."""
        now = time.monotonic()
        for child in self.children:
            if child.proc is None or child.proc.poll() is None:
                continue
            if child.next_start == 0.0:
                quick_death = now - child.started_at < 10
                child.restarts = child.restarts + 1 if quick_death else 1
                child.next_start = now + restart_delay(child.restarts)
                log.warning("%s exited with %s; restarting. Its log ends:\n%s", child.name,
                            child.proc.returncode, child.last_words())
            elif now >= child.next_start:
                child.next_start = 0.0
                child.start(self.settings.ingest_host)
                if self.stack_file.exists():  # its new pid (and metrics port, if it had to move)
                    self.write_stack_file()

    def stop(self) -> None:
        """In order: Orderly's processes (together: none waits for another), then Kafka (brokers,
        then controllers), then PostgreSQL. The children are in process groups of their own
        (app/stack/process.child_argv), so a Ctrl-C or a SIGTERM to the supervisor's group reaches
        them only through here."""
        self.stack_file.unlink(missing_ok=True)
        stop_together([child.proc for child in self.children if child.proc is not None], CHILD_STOP_S)
        self.kafka.stop()
        self.postgres.stop()


def restart_delay(restarts: int) -> float:
    """Seconds before starting a child again that died for the ``restarts``-th time in a row (each
    within 10 s of its start): the first death at once (a worker's partitions wait meanwhile), then
    0.5 s, doubling up to 30 s while it keeps dying."""
    return 0.0 if restarts <= 1 else min(0.5 * 2 ** min(restarts - 2, 6), 30.0)  # 2**6 * 0.5 > 30


USR1_AFTER_S = 5.0  # a child gets a forwarded SIGUSR1 this long after its start (app/cli.py ignores it from then)


def supervise_until_stopped(stack: Stack, started: Callable[[], None] = lambda: None) -> None:
    """Keep the stack's processes running until SIGTERM or Ctrl-C; ``started`` runs once the
    handlers are in place (a signal before them would kill the supervisor with its children)."""
    stopping = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    def dump_children(signum: int, _frame: object) -> None:
        # kill -USR1 <orderly dev>: every Orderly process logs where its tasks wait (.orderly/<name>.log);
        # not one started in the last USR1_AFTER_S, whose interpreter may not ignore it yet (it would end)
        for child in stack.children:
            if child.proc is not None and child.proc.poll() is None and \
                    time.monotonic() - child.started_at > USR1_AFTER_S:
                os.kill(child.proc.pid, signal.SIGUSR1)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGUSR1, dump_children)
    started()
    while not stopping:
        stack.supervise_once()
        time.sleep(0.2)


def run_dev(settings: Settings, brokers: int = 1, workers: int = 1, made: dict[str, str] | None = None) -> int:
    """``made``: the credentials app/stack/credentials.py drew for this stack (printed)."""
    stack = Stack(settings, brokers=brokers, workers=workers)

    def started() -> None:
        stack.start()
        print(json.dumps(stack.describe(), indent=2), flush=True)
        print(credentials.announce(made or {}, stack.stack_file), flush=True)
        print(f"stack description written to {stack.stack_file}; Ctrl-C stops", flush=True)

    try:
        supervise_until_stopped(stack, started)
    finally:
        stack.stop()
    return 0
