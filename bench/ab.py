"""Settings side by side, end to end: ``python -m bench ab MODE '{"name": {"ORDERLY_X": "v"}, ...}'``.

Each round runs bench/e2e.py's baseline once, then Orderly (MODE: at_least_once or exactly_once)
once per variant, each variant with its environment on top of the current one (``{}``: as it is),
on one broker and one PostgreSQL; prints every round and each variant's ratios to its round's
baseline. How a setting's effect is told apart from this machine's drift. The variants' order
turns by one each round (round 1 in the order given): the same settings run twice on one stack
ran slower the second time in the rounds measured (docs/benchmarks.md), so a fixed order could
charge that to the same variants every round. The rounds (twice the variants by default) should
be a multiple of the variants, for each to go first equally often.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import orjson

from bench import e2e
from bench.stack import embedded


@contextmanager
def environment(extra: Mapping[str, str]) -> Iterator[None]:
    """os.environ with ``extra`` on top while inside (e2e's processes inherit it), restored after.

    A variant naming a tree in PYTHONPATH (a build to compare) also gets PYTHONSAFEPATH=1, and its
    PYTHONPATH made absolute: ``python -m app.cli`` otherwise puts its working directory first on
    sys.path, ahead of PYTHONPATH, and every variant would run the build the benchmark started in."""
    if "PYTHONPATH" in extra:
        tree = os.pathsep.join(os.path.abspath(part) for part in extra["PYTHONPATH"].split(os.pathsep))
        extra = {**extra, "PYTHONPATH": tree, "PYTHONSAFEPATH": "1"}
    saved = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ab", description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("at_least_once", "exactly_once"))
    parser.add_argument("variants", help='JSON: {"name": {"ENV": "value", ...}, ...}')
    parser.add_argument("--rounds", type=int, default=None, help="default: twice the number of variants")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        variants = orjson.loads(args.variants)
    except orjson.JSONDecodeError as exc:
        parser.error(f"variants is not JSON: {exc}")
    if not isinstance(variants, dict) or not variants or not all(
            isinstance(env, dict) and all(isinstance(v, str) for v in env.values()) for env in variants.values()):
        parser.error('variants must be a JSON object of objects of strings, e.g. {"now": {}}')
    rounds = args.rounds or 2 * len(variants)
    if rounds % len(variants):
        print(f"{rounds} rounds for {len(variants)} variants: some variants go first more often than others",
              flush=True)
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    number = {name: index for index, name in enumerate(variants)}  # a run's logs are named by it
    with embedded("orderly-bench-ab-") as (work, kafka, postgres):
        for round_no in range(rounds):
            baseline = e2e.run_baseline(postgres, work, round_no)
            base = baseline["rate"]
            line = f"round {round_no + 1}: baseline {base:.0f}/s, CPU s {baseline['cpu_s']}"
            for name, env in e2e.turned(list(variants.items()), round_no):
                with environment(env):
                    result = e2e.run_pipeline(kafka, postgres, args.mode, work,
                                              round_no * len(variants) + number[name])
                ratios[name].append(result["rate"] / base)
                line += (f" | {name} {result['rate']:.0f}/s {ratios[name][-1]:.2f}x (read model "
                         f"{result['tail_s']:.2f} s after the last answer), CPU s {result['cpu_s']}; "
                         f"{e2e.correlation_line(result)}")
            print(line, flush=True)
    for name, found in ratios.items():
        print(f"{name}: {', '.join(f'{r:.2f}' for r in found)}x the round's baseline "
              f"(median {statistics.median(found):.2f})")
    return 0
