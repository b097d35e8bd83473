"""Test support: the mutation run's tally per module, read from mutmut's results (`make mutation`).

mutmut 3 writes one `mutants/<file>.meta` per mutated file, mapping each mutant to the exit code of
its tests. Killed means a test failed (or hung, or crashed) with the mutant in place; a mutant that
no selected test reaches counts as not killed. The last line printed is `mutation: killed K of N`.

    python -m tests.mutation_report [--survivors | --names] [--only app/core/pg.py ...]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# mutmut 3.7's exit codes (mutmut.__main__.status_by_exit_code): 1 and 3 a failed test run,
# 36/24/-24/152/255 a timeout, -9/-11 a crash, 37 the type checker; None a mutant not run.
CAUGHT = frozenset({1, 3, 36, 24, -24, 152, 255, -9, -11, 37})
NOT_RUN = None
NO_TESTS = frozenset({5, 33})


@dataclass
class Tally:
    """One module's mutants: how many, how many caught, and the names of the others."""

    total: int = 0
    killed: int = 0
    not_run: int = 0
    survivors: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)  # each survivor's: survived, or no test reaches it


def tally(root: Path, only: Sequence[str] = ()) -> dict[str, Tally]:
    """Each mutated module's tally, from `root/mutants/**.meta`, optionally only the named files."""
    out: dict[str, Tally] = {}
    for meta in sorted((root / "mutants").glob("app/**/*.py.meta")):
        module = str(meta.relative_to(root / "mutants"))[: -len(".meta")]
        if only and module not in only:
            continue
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        if not codes:
            continue
        t = out.setdefault(module, Tally())
        for name, code in sorted(codes.items()):
            t.total += 1
            if code in CAUGHT:
                t.killed += 1
            elif code is NOT_RUN:
                t.not_run += 1
            else:
                t.survivors.append(name)
                t.why.append("no test reaches it" if code in NO_TESTS else "survived")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--survivors", action="store_true", help="list each mutant not killed")
    parser.add_argument("--names", action="store_true", help="print only the names of the mutants not killed")
    parser.add_argument("--only", nargs="*", default=(), help="only these files (app/core/pg.py ...)")
    args = parser.parse_args(argv)
    tallies = tally(Path.cwd(), args.only)
    if args.names:  # for `mutmut run NAME...`: a mutant named is run again, so a new test can kill it
        print("\n".join(name for t in tallies.values() for name in t.survivors))
        return 0
    killed = total = 0
    for module, t in tallies.items():
        pending = f", {t.not_run} not run" if t.not_run else ""
        print(f"{module}: killed {t.killed} of {t.total}{pending}")
        if args.survivors:
            for name, why in zip(t.survivors, t.why, strict=True):
                print(f"    {name} ({why})")
        killed += t.killed
        total += t.total
    print(f"mutation: killed {killed} of {total}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
