"""`make test`: the whole suite as two pytest runs at once, one per lane, on the same machine.

Most of the suite's time is waiting — for a broker to elect a leader, a group's session to lapse,
PostgreSQL to come back after its minute down, a merchant that answers after 30 s — not computing, so
one run at a time leaves a core idle for much of it (docs/testing.md, "Two lanes"). The tests that
start their own stacks of several brokers and workers, kill them and time what follows (marked
``stack_lane``: tests/chaos and the whole-stack tests named in tests/conftest.py) run in one lane,
everything else in the other. Each lane is an ordinary pytest run with its own broker, PostgreSQL
and temporary directory (/tmp/orderly-pytest-<pid>); neither skips anything.

The stack lane prints as it goes; the other lane's output goes to ``.orderly/test-lane.log`` and
is printed whole when it ends. The exit status is the first failing lane's, else 0. Ctrl-C or
SIGTERM stops both lanes (each pytest gets SIGINT, as from a terminal, then SIGKILL 30 s later).

    python -m tests.lanes [pytest options…]   # the options go to both runs
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

LANES = (("stack", "stack_lane"), ("main", "not stack_lane"))
LOG = Path(".orderly") / "test-lane.log"
STOP_GRACE_S = 30.0


def start(marks: str, options: list[str], out: int | None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "pytest", "tests", "-m", marks, *options],
                            stdout=out, stderr=subprocess.STDOUT if out is not None else None,
                            start_new_session=True)


def kill_left(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.returncode is None:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main(options: list[str]) -> int:
    LOG.parent.mkdir(exist_ok=True)
    started = time.monotonic()
    with LOG.open("wb") as log:
        (_, stack_marks), (main_name, main_marks) = LANES
        side = start(main_marks, options, log.fileno())
        front = start(stack_marks, options, None)
        procs = [front, side]

        stopping: list[int] = []

        def interrupted(signum: int, _frame: FrameType | None) -> None:
            # It runs inside a Popen.wait below, which holds that Popen's lock: it only signals (as
            # Ctrl-C does: each pytest tears its fixtures down) and the waits below go on.
            if not stopping:
                stopping.append(signum)
                for proc in procs:
                    if proc.returncode is None:
                        os.kill(proc.pid, signal.SIGINT)
                late = threading.Timer(STOP_GRACE_S, kill_left, [procs])
                late.daemon = True
                late.start()
        signal.signal(signal.SIGTERM, interrupted)
        signal.signal(signal.SIGINT, interrupted)
        codes = {"stack": front.wait(), main_name: side.wait()}
    sys.stdout.flush()
    print(f"\n{'=' * 30} lane {main_name!r} ({LOG}) {'=' * 30}", flush=True)
    sys.stdout.buffer.write(LOG.read_bytes())
    print(f"\nlanes: {', '.join(f'{name} exit {code}' for name, code in codes.items())}; "
          f"{time.monotonic() - started:.0f} s in all", flush=True)
    if stopping:
        return 128 + stopping[0]
    return next((code for code in codes.values() if code != 0), 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
