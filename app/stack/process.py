"""Helpers shared by the embedded servers: free ports, waiting, stopping a child by its PID."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger("orderly.stack")

# Spare ports are drawn from here, below the kernel's ephemeral range (where outgoing connections
# take their local port) and above the dev stack's documented defaults (8080, 15432, 19092).
SPARE_PORTS_FROM = 20000


class PortTakenError(RuntimeError):
    """A port that must not move is in use; the message says what to do."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local end of outgoing connections."""
    try:
        low, high = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def spare_port(host: str = "127.0.0.1", span: int = 1) -> int:
    """A free port to keep across restarts, outside the ephemeral range when one is free there,
    with the ``span - 1`` ports after it free as well (a cluster's brokers listen on consecutive
    ports: checking only the first once let `orderly dev --brokers 3` meet its third port taken).

    A port from ``free_port`` lies in that range, so any outgoing connection may take it while the
    server is down (`orderly dev` once could not restart its broker for that reason). No port is
    given twice by one process: two picks before either server binds would otherwise both find it free.
    """
    low, high = ephemeral_ports()
    # below the range (from SPARE_PORTS_FROM) or above it, the whole span outside it
    outside: list[int] = [*range(SPARE_PORTS_FROM, low - span + 1),
                          *range(max(high + 1, SPARE_PORTS_FROM), 65536 - span + 1)]
    for port in random.sample(outside, min(64, len(outside))):
        if _unhanded(port, span) and all(port_is_free(port + i, host) for i in range(span)):
            return _hand(port, span)
    for _ in range(64):  # none free outside it: one inside
        port = free_port(host)
        if port + span - 1 <= 65535 and _unhanded(port, span) and all(port_is_free(port + i, host)
                                                                       for i in range(1, span)):
            return _hand(port, span)
    raise RuntimeError(f"no {span} consecutive free ports on {host}")


_HANDED: set[int] = set()  # the ports spare_port gave in this process


def _unhanded(port: int, span: int) -> bool:
    return _HANDED.isdisjoint(range(port, port + span))


def _hand(port: int, span: int) -> int:
    _HANDED.update(range(port, port + span))
    return port


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def sticky_ports(path: Path, names: tuple[str, ...], wanted: dict[str, int | None]) -> dict[str, int]:
    """Ports remembered in ``path`` so that a persistent data dir comes back on the same ports.

    A KRaft controller records its own endpoint in the metadata log, and PostgreSQL clients keep
    the DSN: a restart that moved ports would strand both.
    """
    known: dict[str, int] = json.loads(path.read_text()) if path.exists() else {}
    ports: dict[str, int] = {}
    for name in names:
        asked = wanted.get(name)
        if asked:
            ports[name] = asked
        elif name in known:
            ports[name] = known[name]
        else:
            ports[name] = spare_port()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ports))
    return ports


def keep_or_move(path: Path, name: str, port: int, what: str, host: str = "127.0.0.1") -> int:
    """``port`` if it is free, else a new spare port, remembered in ``path`` in its place.

    Only for a port that nothing outside the server needs to find again (a KRaft controller's own
    listener): a restart must not depend on it staying free while the server was down.
    """
    if port_is_free(port, host):
        return port
    moved = spare_port(host)
    known: dict[str, int] = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**known, name: moved}))
    log.warning("%s: port %d on %s is taken by another process; moving to %d", what, port, host, moved)
    return moved


def wait_until(check: Callable[[], bool], timeout: float, what: str, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not alive():
            raise RuntimeError(f"{what}: the process exited while starting")
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not ready after {timeout:.0f}s")


def child_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` of a child of the embedded stack, so that it dies with the thread that starts it.

    Each child runs in a process group of its own (:data:`CHILD_GROUP`): a terminal's Ctrl-C, or a
    SIGTERM to the supervisor's group, reaches the supervisor alone, which stops the children in
    order (processes, brokers, controllers) — sent to everyone at once, the controllers left first
    and a broker's controlled shutdown waited for them for ever. Out of the group, a supervisor
    killed by SIGKILL would leave them running: ``setpriv --pdeathsig KILL`` (util-linux) has the
    kernel kill the child when its parent goes, which every part survives (it is a kill -9). The
    kernel ties that signal to the *thread* that forked, so only a child started from the main
    thread gets it (a test restarting one from a worker thread keeps it past that thread's end).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return list(argv)
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]


CHILD_GROUP = 0  # Popen(process_group=CHILD_GROUP): a group of the child's own, named by its PID


def stop_together(procs: Sequence[subprocess.Popen[bytes]], timeout: float, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to all of ``procs`` (our own children) at once, wait for each within one shared
    ``timeout`` and SIGKILL whoever is still there: processes that depend on nobody among them stop
    in the time of the slowest, not the sum."""
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, sig)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def stop_process(proc: subprocess.Popen[bytes], timeout: float, sig: int = signal.SIGTERM) -> int:
    """Send ``sig`` to our own child by PID, wait, and SIGKILL it if it does not leave in time."""
    if proc.poll() is None:
        os.kill(proc.pid, sig)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
    return proc.wait()
