"""`orderly dev --brokers 3 --workers 3` stopped as a terminal stops it: SIGINT (Ctrl-C) or SIGTERM
to its whole process group. Everything it started leaves, in order — Orderly's processes, then the
brokers, then the controllers — and nothing is left behind (issue #47: sent to every process at
once, the controllers left first and a broker's controlled shutdown waited for them for ever)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.stack.process import spare_port
from tests.e2e.test_dev_stack import wait_for_stack

STOP_WITHIN_S = 15.0  # DESIGN.md §7


def gone(pid: int) -> bool:
    """The process has exited (a zombie not reaped yet counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: read while the process was being reaped
        return True


def tail(log: Path, size: int = 6000) -> str:
    """The end of a process's log (``orderly dev`` writes each to ``.orderly/<name>.log``), for a failure's message."""
    try:
        return log.read_bytes()[-size:].decode(errors="replace")
    except OSError as exc:
        return f"({log}: {exc})"


def watch(pids: dict[str, int], within_s: float) -> dict[str, float]:
    """When (monotonic) each process was first seen gone, polling every 20 ms for ``within_s``."""
    left, seen = dict(pids), {}
    deadline = time.monotonic() + within_s
    while left and time.monotonic() < deadline:
        for name, pid in list(left.items()):
            if gone(pid):
                seen[name] = time.monotonic()
                del left[name]
        time.sleep(0.02)
    return seen


@pytest.mark.timeout(400)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_to_the_group_stops_the_three_broker_stack_in_order(tmp_path: Path, sig: int) -> None:
    data_dir = tmp_path / ".orderly"
    env = {**os.environ, "ORDERLY_DATA_DIR": str(data_dir), "ORDERLY_KAFKA": f"127.0.0.1:{spare_port(span=3)}",
           "ORDERLY_POSTGRES_DSN": f"postgresql://postgres@127.0.0.1:{spare_port()}/postgres",
           "ORDERLY_INGEST_PORT": str(spare_port()), "ORDERLY_ADMIN_PORT": str(spare_port()),
           "ORDERLY_PARTITIONS": "3"}
    log = tmp_path / "dev.log"
    with log.open("ab") as out:  # a session of its own: its group is the terminal's foreground job
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "dev", "--brokers", "3", "--workers", "3"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        stack = wait_for_stack(data_dir, proc, log)
        pids = {f"process:{name}": p["pid"] for name, p in stack["processes"].items()}
        pids |= {f"broker:{b['node_id']}": b["pid"] for b in stack["brokers"]}
        pids |= {f"controller:{c['node_id']}": c["pid"] for c in stack["controllers"]}
        pids["postgres"] = stack["postgres"]["pid"]
        assert len([n for n in pids if n.startswith("broker:")]) == 3
        assert len([n for n in pids if n.startswith("controller:")]) == 3
        assert len([n for n in pids if n.startswith("process:worker")]) == 3
        assert not any(gone(pid) for pid in pids.values()), pids

        sent = time.monotonic()
        os.killpg(proc.pid, sig)  # as a terminal does: the signal reaches every process of the group
        seen = watch({**pids, "supervisor": proc.pid}, within_s=60)
        stuck = sorted(set(pids) - set(seen))
        assert not stuck, f"still running 60 s after the signal: {stuck}\n" + log.read_text()[-3000:]
        assert proc.wait(5) == 0, log.read_text()[-3000:]
        took = seen["supervisor"] - sent
        print(f"stopped in {took:.1f} s: " + ", ".join(f"{n} {t - sent:.1f}" for n, t in sorted(
            seen.items(), key=lambda kv: kv[1])))
        slowest = max((n for n in seen if n.startswith("process:")), key=seen.__getitem__)
        assert took <= STOP_WITHIN_S, (f"the stack took {took:.1f} s to stop; the last of Orderly's processes "
                                       f"to stop was {slowest}:\n{tail(data_dir / (slowest.split(':')[1] + '.log'))}")

        def last(kind: str) -> float:
            return max(t for n, t in seen.items() if n.startswith(kind))

        def first(kind: str) -> float:
            return min(t for n, t in seen.items() if n.startswith(kind))

        assert last("process:") <= first("broker:"), seen  # Orderly's processes before Kafka
        assert last("broker:") <= first("controller:"), seen  # brokers before their controllers
        assert last("process:") <= seen["postgres"], seen  # and PostgreSQL after its clients
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.timeout(300)
def test_a_supervisor_killed_outright_takes_its_children_along(tmp_path: Path) -> None:
    """Out of the supervisor's process group, a child would outlive a supervisor killed by SIGKILL
    (an OOM kill, a CI timeout): the kernel's parent-death signal ends it instead."""
    data_dir = tmp_path / ".orderly"
    env = {**os.environ, "ORDERLY_DATA_DIR": str(data_dir), "ORDERLY_KAFKA": f"127.0.0.1:{spare_port()}",
           "ORDERLY_POSTGRES_DSN": f"postgresql://postgres@127.0.0.1:{spare_port()}/postgres",
           "ORDERLY_INGEST_PORT": str(spare_port()), "ORDERLY_ADMIN_PORT": str(spare_port()),
           "ORDERLY_PARTITIONS": "2"}
    log = tmp_path / "dev.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "dev"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    pids: dict[str, int] = {}
    try:
        stack = wait_for_stack(data_dir, proc, log)
        pids = {name: p["pid"] for name, p in stack["processes"].items()}
        pids |= {"broker": stack["brokers"][0]["pid"], "postgres": stack["postgres"]["pid"]}
        assert not any(gone(pid) for pid in pids.values()), pids
        os.kill(proc.pid, signal.SIGKILL)  # the supervisor alone, by its PID
        proc.wait()
        seen = watch(pids, within_s=30)
        assert sorted(set(pids) - set(seen)) == [], "outlived their supervisor"
    finally:
        for pid in pids.values():  # only if the test failed: our own stack's processes, by PID
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
