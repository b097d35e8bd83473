"""`python -m bench [name ...]`: run the benchmarks and print their figures."""

from __future__ import annotations

import sys

from bench import ab, decide, e2e, floor, idle, ingest, latency, replay, restart, state, txn, worker

BENCHES = {"decide": decide.main, "ingest": ingest.main, "worker": worker.main, "e2e": e2e.main,
           "latency": latency.main, "replay": replay.main, "state": state.main,
           "restart": restart.main, "txn": txn.main, "idle": idle.main, "floor": floor.main}


def main(argv: list[str]) -> int:
    if argv[:1] == ["ab"]:  # settings side by side: python -m bench ab MODE '{"name": {...}}'
        return ab.command(argv[1:])
    if argv[:1] == ["idle"] and len(argv) > 1:  # builds side by side: python -m bench idle '{"name": {...}}'
        idle.main(argv[1:])
        return 0
    if argv[:1] == ["floor"] and len(argv) > 1:  # Orderly's builds against the floor: python -m bench floor '{...}'
        floor.main(argv[1:])
        return 0
    if argv[:1] == ["restart"] and len(argv) > 1:  # with options: python -m bench restart --rounds 3
        return restart.command(argv[1:])
    chosen = argv or list(BENCHES)
    for name in chosen:
        if name not in BENCHES:
            print(f"unknown benchmark {name!r}; choose from {', '.join(BENCHES)}", file=sys.stderr)
            return 2
        BENCHES[name]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
