"""The processes behind the answer yield the CPU (app/behind.py, app/process_setup.lower_priority):
every thread at the niceness asked, threads started later too, and never more priority than the
process had. Each case runs in a child process: the niceness of this one is never raised back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import COMMANDS
from app.setting_uses import USES

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import os, sys, threading
from app.process_setup import lower_priority

def nice_of(tid):
    return int(open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()[16])

stop = threading.Event()
before = threading.Thread(target=stop.wait)
before.start()
runs_at = lower_priority(int(sys.argv[1]))
after = threading.Thread(target=stop.wait)
after.start()
tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
print(runs_at, lower_priority(int(sys.argv[2])), *sorted({nice_of(t) for t in tids}), len(tids))
stop.set()
"""


def run_child(first: int, second: int, start_at: int = 0) -> list[int]:
    argv = [sys.executable, "-c", CHILD, str(first), str(second)]
    out = subprocess.run(["nice", "-n", str(start_at), *argv] if start_at else argv, cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return [int(word) for word in out.split()]


def test_every_thread_runs_at_the_niceness_asked_those_started_later_too() -> None:
    runs_at, again, *nices, threads = run_child(10, 10)
    assert (runs_at, again, nices, threads) == (10, 10, [10], 3)


def test_a_lower_niceness_asked_later_never_raises_the_priority_back() -> None:
    runs_at, again, *nices, _ = run_child(10, 3)
    assert (runs_at, again, nices) == (10, 10, [10])


def test_a_process_started_nicer_keeps_its_own() -> None:
    runs_at, again, *nices, _ = run_child(10, 0, start_at=15)
    assert (runs_at, again, nices) == (15, 15, [15])


def test_zero_leaves_the_process_as_it_was() -> None:
    assert run_child(0, 0)[:3] == [os.getpriority(os.PRIO_PROCESS, 0)] * 3


@pytest.mark.parametrize("process", ["ingest", "worker", "projector", "effects", "fetcher", "admin"])
def test_only_the_processes_behind_the_answer_read_the_setting(process: str) -> None:
    """The ingest answers the gateways and the admin an operator: neither yields (checked in
    tests/e2e/test_observability.py on the running processes)."""
    assert process in COMMANDS
    assert ("pipeline_nice" in USES[process]) is (process not in ("ingest", "admin"))
