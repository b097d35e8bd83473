"""bench/stack.py's CPU readings count a child that started and ended between two readings (a
PostgreSQL backend or autovacuum worker that came and went during a timed run)."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.stack import process_cpu

BUSY = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end:\n    pass\n"


def test_a_child_that_came_and_went_between_two_readings_is_counted() -> None:
    before = process_cpu(os.getpid(), children=True)
    subprocess.run([sys.executable, "-c", BUSY], check=True)  # started, busy 0.5 CPU-s, ended and reaped
    assert process_cpu(os.getpid(), children=True) - before >= 0.4


def test_a_child_alive_at_one_reading_and_reaped_before_the_next_counts_only_its_cpu_since() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys\nsys.stdin.read()\n" + BUSY],
                             stdin=subprocess.PIPE)
    try:
        before = process_cpu(os.getpid(), children=True)  # the child alive, idle, its start counted
        assert child.stdin is not None
        child.stdin.close()  # now it busies itself 0.5 CPU-s and ends
        child.wait()
        spent = process_cpu(os.getpid(), children=True) - before
    finally:
        child.kill()
    assert 0.4 <= spent < 0.9  # its busy half second, not its whole life again nor nothing


def test_without_children_only_the_process_itself_is_counted() -> None:
    before = process_cpu(os.getpid())
    subprocess.run([sys.executable, "-c", BUSY], check=True)
    assert process_cpu(os.getpid()) - before < 0.15  # the wait for the child is nearly free
