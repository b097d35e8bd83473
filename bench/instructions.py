"""The decision path's cost in instructions, repeatable where seconds are not.

``python -m bench.instructions measure`` runs ``python -m bench.instructions decide <marks.so>``
under ``valgrind --tool=callgrind --instr-atstart=no``: the process loads Faust and tunes its garbage
collector as the worker's does at start-up (gc.freeze and ORDERLY_GC_THRESHOLD), builds the log with
callgrind's instrumentation off, then turns it on only around deciding the log ROUNDS times (through
bench/callgrind_marks.c, built with gcc: Python cannot issue valgrind's client requests itself) and
dumps the count. It prints the instructions per record (valgrind and gcc must be on the PATH).
Counting only the measured part keeps the run short: the imports run uninstrumented, about 5x faster
than under callgrind's instrumentation (the count is the same as the earlier method's, which ran the
whole process twice, with and without the decisions, and took the difference).
Settings: ``BENCH_RESOURCES`` (100), ``BENCH_ROUNDS`` (3).
"""

from __future__ import annotations

import ctypes
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
MARKS = Path(__file__).with_name("callgrind_marks.c")


def decide_marked(marks: str) -> int:
    """Decide the log ROUNDS times between the two marks; the records in the log."""
    lib = ctypes.CDLL(marks)
    decide.as_the_worker()
    log = decide.build(RESOURCES)
    lib.orderly_measure_start()
    for _ in range(ROUNDS):
        decide.decide_all(log)
    lib.orderly_measure_stop()
    return len(log)


def measure() -> None:
    with tempfile.TemporaryDirectory(prefix="orderly-callgrind-") as work:
        marks, out = Path(work) / "marks.so", Path(work) / "callgrind.out"
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(marks), str(MARKS)], check=True)
        done = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                               sys.executable, "-m", "bench.instructions", "decide", str(marks)],
                              check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        records = int(done.stdout.split()[-1])
        dumped = Path(f"{out}.1")  # the dump at the second mark; the file at exit holds the rest (none)
        found = re.search(rb"^totals: (\d+)", dumped.read_bytes(), re.MULTILINE) if dumped.exists() else None
        if found is None:
            raise RuntimeError(f"no count dumped at the mark ({dumped}): was the process run under callgrind?")
    cost = int(found[1])
    print(f"decide: {records} records x {ROUNDS} rounds: {cost / 1e6:,.0f} M instructions, "
          f"{cost / (records * ROUNDS) / 1e3:,.1f} k per record")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "measure"
    if mode == "measure":
        measure()
    elif mode == "decide" and len(sys.argv) == 3:
        print(decide_marked(sys.argv[2]))
    else:
        raise SystemExit("usage: python -m bench.instructions [measure | decide <marks.so>]")
