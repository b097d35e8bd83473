"""Helpers shared by the embedded servers: free ports, waiting, stopping a child by its PID."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
            ports[name] = free_port()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ports))
    return ports


def wait_until(check: Callable[[], bool], timeout: float, what: str, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not alive():
            raise RuntimeError(f"{what}: the process exited while starting")
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not ready after {timeout:.0f}s")


def stop_process(proc: subprocess.Popen[bytes], timeout: float, sig: int = signal.SIGTERM) -> int:
    """Send ``sig`` to our own child by PID, wait, and SIGKILL it if it does not leave in time."""
    if proc.poll() is None:
        os.kill(proc.pid, sig)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
    return proc.wait()
