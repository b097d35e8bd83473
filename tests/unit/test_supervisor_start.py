"""The supervisor's start of a served child (the ingest) whose metrics port an outgoing connection
took between the supervisor's check and the child's bind: the child dies at start, and is started
again on a fresh metrics port instead of failing the whole stack. A child dying for another reason
still fails the start."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import supervisor
from app.stack.process import port_is_free, spare_port, stop_process
from app.supervisor import Child, _wait_serving

# binds the metrics port first (exits 1 if taken, as the ingest does), then serves its own port
SERVED = """
import os, socket, sys, time
metrics = socket.socket(); metrics.bind(("127.0.0.1", int(os.environ["ORDERLY_METRICS_PORT"])))
if sys.argv[2] == "die": sys.exit(2)
served = socket.socket(); served.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
served.bind(("127.0.0.1", int(sys.argv[1]))); served.listen(); metrics.listen(); time.sleep(60)
"""


@pytest.fixture
def squatted() -> Iterator[socket.socket]:
    """A port held by someone else, as the local end of an outgoing connection holds it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s


def child_of(tmp_path: Path, metrics_port: int, mode: str) -> tuple[Child, int]:
    port = spare_port()
    child = Child("ingest", [sys.executable, "-c", SERVED, str(port), mode], {}, tmp_path / "ingest.log",
                  metrics_port=metrics_port)
    return child, port


def test_a_served_child_whose_metrics_port_was_taken_meanwhile_starts_again_elsewhere(
        tmp_path: Path, squatted: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = squatted.getsockname()[1]
    checks = iter([True])  # the supervisor's check sees it free: the connection came just after
    real = port_is_free
    monkeypatch.setattr(supervisor, "port_is_free",
                        lambda port, host="127.0.0.1": next(checks, None) or real(port, host))
    child, port = child_of(tmp_path, taken, "serve")
    child.start("127.0.0.1")
    first = child.proc
    try:
        _wait_serving(child, port, "127.0.0.1")
        assert first is not None and first.returncode == 1  # died on the taken port
        assert child.proc is not first and child.proc is not None and child.proc.poll() is None
        assert child.metrics_port != taken and child.env["ORDERLY_METRICS_PORT"] == str(child.metrics_port)
    finally:
        if child.proc is not None:
            stop_process(child.proc, 5)


def test_a_port_freed_again_by_the_time_the_child_died_is_told_by_its_log(
        tmp_path: Path, squatted: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    """The outgoing connection that held the port may be closed by the time the supervisor looks:
    the child's log ("Address already in use") tells why it died."""
    taken = squatted.getsockname()[1]
    monkeypatch.setattr(supervisor, "port_is_free", lambda port, host="127.0.0.1": True)
    child, port = child_of(tmp_path, taken, "serve")
    child.start("127.0.0.1")
    first = child.proc
    assert first is not None

    def release() -> None:  # the connection ends once the child died on it
        first.wait(30)
        squatted.close()

    releasing = threading.Thread(target=release)
    releasing.start()
    try:
        _wait_serving(child, port, "127.0.0.1")
        assert first.returncode == 1 and child.proc is not first and child.metrics_port == taken
    finally:
        releasing.join(30)
        if child.proc is not None:
            stop_process(child.proc, 5)


def test_a_served_child_dying_for_its_own_reason_fails_the_start(tmp_path: Path) -> None:
    child, port = child_of(tmp_path, spare_port(), "die")
    child.start("127.0.0.1")
    first = child.proc
    with pytest.raises(RuntimeError, match="exited while starting"):
        _wait_serving(child, port, "127.0.0.1")
    assert child.proc is first and first is not None and first.returncode == 2  # not started again


def test_a_metrics_port_taken_at_every_start_gives_up(tmp_path: Path, squatted: socket.socket,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    taken = squatted.getsockname()[1]
    monkeypatch.setattr(supervisor, "port_is_free", lambda port, host="127.0.0.1": port != taken)
    monkeypatch.setattr(supervisor, "free_port", lambda host="127.0.0.1": taken)  # every new one is taken too
    child, port = child_of(tmp_path, taken, "serve")
    starts: list[str] = []
    start = child.start

    def counted(host: str) -> None:
        starts.append(host)
        start(host)

    monkeypatch.setattr(child, "start", counted)
    child.start("127.0.0.1")
    with pytest.raises(RuntimeError, match="exited while starting"):
        _wait_serving(child, port, "127.0.0.1")
    assert len(starts) == supervisor.SERVING_ATTEMPTS == 3
