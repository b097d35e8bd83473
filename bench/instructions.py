"""The decision path's cost in instructions, repeatable where seconds are not: run under
``valgrind --tool=callgrind`` twice, ``python -m bench.instructions build`` (only builds the log)
and ``python -m bench.instructions decide`` (builds it, then decides it ROUNDS times); the cost per
record is the difference of the two totals over ROUNDS times the log's records.

``python -m bench.instructions measure`` runs both under valgrind, after one run without it (so that
neither compiles a changed module), and prints the figure (valgrind must be on the PATH). The
process loads Faust first and tunes its garbage collector (gc.freeze and ORDERLY_GC_THRESHOLD), as
the worker's does at start-up. Settings:
``BENCH_RESOURCES`` (100), ``BENCH_ROUNDS`` (3).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import faust  # noqa: F401  # the worker's process has it loaded: the same interpreter state

from bench import decide

RESOURCES = int(os.environ.get("BENCH_RESOURCES", "100"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


def run(mode: str) -> int:
    decide.as_the_worker()
    log = decide.build(RESOURCES)
    if mode == "decide":
        for _ in range(ROUNDS):
            decide.decide_all(log)
    return len(log)


def instructions(mode: str, out: Path) -> int:
    """The total instructions (Ir) of one run of ``mode`` under callgrind."""
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                    sys.executable, "-m", "bench.instructions", mode],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    found = re.search(rb"^summary: (\d+)", out.read_bytes(), re.MULTILINE) or \
        re.search(rb"^totals: (\d+)", out.read_bytes(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no summary line in {out}")
    return int(found[1])


def measure() -> None:
    records = len(decide.build(RESOURCES))
    # One unmeasured run first: the first run after a source change compiles the changed modules and
    # writes their .pyc, tens of millions of instructions the second would not repeat (a figure
    # 19 k too low was seen after editing a comment in app/core/card.py).
    subprocess.run([sys.executable, "-m", "bench.instructions", "build"], check=True, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="orderly-callgrind-") as work:
        built = instructions("build", Path(work) / "build.out")
        decided = instructions("decide", Path(work) / "decide.out")
    cost = decided - built
    print(f"decide: {records} records x {ROUNDS} rounds: {cost / 1e6:,.0f} M instructions, "
          f"{cost / (records * ROUNDS) / 1e3:,.1f} k per record")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "measure"
    if mode == "measure":
        measure()
    elif mode in ("build", "decide"):
        print(run(mode))
    else:
        raise SystemExit("usage: python -m bench.instructions [measure|build|decide]")
