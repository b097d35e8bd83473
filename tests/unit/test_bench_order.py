"""The benchmarks' run order: no mode or variant always runs later on a stack than another."""

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import ab, e2e
from bench.e2e import MODES, designs, turned


@given(st.integers(min_value=0, max_value=1000))
def test_a_round_is_the_baseline_both_modes_and_the_baseline_again(round_no: int) -> None:
    runs = designs(round_no)
    assert runs[0] == runs[-1] == "baseline"
    assert sorted(runs[1:-1]) == sorted(MODES)


@given(st.integers(min_value=1, max_value=50))
def test_each_mode_goes_first_in_half_of_an_even_number_of_rounds(pairs: int) -> None:
    first = Counter(designs(round_no)[1] for round_no in range(2 * pairs))
    assert first == {mode: pairs for mode in MODES}


@given(st.lists(st.integers(), min_size=1, max_size=8, unique=True), st.integers(min_value=0, max_value=100))
def test_turned_is_the_same_variants_in_a_turned_order(items: list[int], round_no: int) -> None:
    order = turned(items, round_no)
    assert sorted(order) == sorted(items)
    start = order.index(items[0])
    assert order[start:] + order[:start] == items  # a rotation: the variants keep their neighbours


@given(st.lists(st.integers(), min_size=1, max_size=8, unique=True), st.integers(min_value=1, max_value=5))
def test_each_variant_goes_first_equally_often_over_a_multiple_of_their_count(items: list[int], times: int) -> None:
    first = Counter(turned(items, round_no)[0] for round_no in range(times * len(items)))
    assert first == {item: times for item in items}


class FakeStack:
    """bench.stack.embedded without a broker or PostgreSQL: counts the stacks started."""

    def __init__(self) -> None:
        self.started = 0

    @contextmanager
    def __call__(self, prefix: str) -> Iterator[tuple[str, str, str]]:
        self.started += 1
        yield f"work{self.started}", "kafka", "postgres"


def run(rate: float) -> dict[str, Any]:
    return {"rate": rate, "events": 30_000, "cpu_s": {"ingest": 1.0}, "elapsed_s": 30_000 / rate,
            "answered_s": 25_000 / rate, "tail_s": 5_000 / rate,
            "correlations": {"rate": 2500.0, "cpu_s": {"ingest": 0.5, "postgres": 0.25, "worker": 0.1}}}


def test_e2e_runs_the_modes_in_turn_and_pairs_each_with_its_own_rounds_baselines(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[int, str]] = []  # (stack, design)
    stack = FakeStack()
    baseline_rate = {0: 1000.0, 3: 3000.0}  # before and after Orderly's runs: their mean is 2000

    def baseline(postgres: str, work: str, index: int) -> dict[str, Any]:
        calls.append((stack.started, "baseline"))
        return run(baseline_rate[index] * stack.started)

    def pipeline(kafka: str, postgres: str, mode: str, work: str, round_no: int) -> dict[str, Any]:
        calls.append((stack.started, mode))
        return run((5000.0 if mode == "at_least_once" else 4000.0) * stack.started)

    saved: dict[str, Any] = {}
    monkeypatch.setattr(e2e, "ROUNDS", 4)
    monkeypatch.setattr(e2e, "embedded", stack)
    monkeypatch.setattr(e2e, "run_baseline", baseline)
    monkeypatch.setattr(e2e, "run_pipeline", pipeline)
    monkeypatch.setattr(e2e, "save_results", lambda name, results: saved.update(results))
    e2e.main()
    assert stack.started == 4  # a stack per round
    assert calls == [(k + 1, design) for k in range(4) for design in designs(k)]
    assert saved["first_in_round"] == ["at_least_once", "exactly_once", "at_least_once", "exactly_once"]
    assert saved["at_least_once"]["round_ratios"] == [2.5] * 4  # 5000k / mean(1000k, 3000k)
    assert saved["exactly_once"]["round_ratios"] == [2.0] * 4
    assert saved["exactly_once"]["round_ratios_to_at_least_once"] == [0.8] * 4
    assert saved["at_least_once"]["round_ratios_to_the_first_baseline"] == [5.0] * 4
    # each round's own tail (a sixth of its run in run()), in round order
    assert saved["at_least_once"]["round_tails_s"] == [round(1.0 / k, 3) for k in range(1, 5)]
    assert saved["exactly_once"]["round_tails_s"] == [round(1.25 / k, 3) for k in range(1, 5)]
    out = capsys.readouterr().out
    assert "at_least_once: 2.50, 2.50, 2.50, 2.50 (median 2.50, worst 2.50)" in out
    # the correlation PUTs before each run: CPU-s per 1,000 of the 10,000 deposits' PUTs
    assert "correlations 2500 PUT/s, CPU-s per 1,000 PUTs {'ingest': 0.05, 'postgres': 0.025}" in out


def test_ab_turns_the_variants_each_round_and_keeps_each_variants_own_ratios(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    order: list[tuple[str | None, int]] = []  # (the variant's setting, the run's log tag)
    monkeypatch.delenv("BENCH_VARIANT", raising=False)
    monkeypatch.setattr(ab, "embedded", FakeStack())
    monkeypatch.setattr(e2e, "run_baseline", lambda postgres, work, round_no: run(1000.0))

    def pipeline(kafka: str, postgres: str, mode: str, work: str, tag: int) -> dict[str, Any]:
        variant = os.environ.get("BENCH_VARIANT")
        order.append((variant, tag))
        return run({"a": 2000.0, "b": 3000.0, "c": 4000.0}[variant or "a"])

    monkeypatch.setattr(e2e, "run_pipeline", pipeline)

    variants = '{"a": {"BENCH_VARIANT": "a"}, "b": {"BENCH_VARIANT": "b"}, "c": {"BENCH_VARIANT": "c"}}'
    assert ab.command(["exactly_once", variants]) == 0  # twice the variants: 6 rounds
    assert [variant for variant, _ in order] == list("abc" "bca" "cab" "abc" "bca" "cab")
    assert [tag for _, tag in order] == [3 * k + "abc".index(v) for k in range(6) for v in turned(list("abc"), k)]
    out = capsys.readouterr().out
    assert "a: 2.00, 2.00, 2.00, 2.00, 2.00, 2.00x" in out
    assert "c: 4.00, 4.00, 4.00, 4.00, 4.00, 4.00x" in out
    assert "BENCH_VARIANT" not in os.environ  # each variant's setting only around its runs


def test_a_variants_pythonpath_names_the_build_its_processes_run(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m`` puts its working directory first on sys.path: without PYTHONSAFEPATH a variant's
    PYTHONPATH would lose to the tree the benchmark runs in, and both builds would be the same."""
    here, other = tmp_path / "here", tmp_path / "other"
    for tree in (here, other):
        tree.mkdir()
        (tree / "orderly_probe.py").write_text(f"print({tree.name!r})\n")
    monkeypatch.chdir(here)

    def probe() -> str:
        return subprocess.run([sys.executable, "-m", "orderly_probe"], capture_output=True, text=True,
                              check=True).stdout.strip()

    with ab.environment({"PYTHONPATH": str(other)}):
        variant = probe()
    with ab.environment({"PYTHONPATH": "."}):  # relative: the tree the benchmark was started in
        current = probe()
    assert (variant, current) == ("other", "here")
    assert "PYTHONSAFEPATH" not in os.environ


def test_cpu_per_webhook_leaves_out_the_load_generator_unless_asked() -> None:
    """#47 counts Orderly's processes, Kafka and PostgreSQL per 1,000 webhooks: the load generator
    is the gateway's side, printed apart."""
    run = {"events": 2000, "cpu_s": {"ingest": 1.0, "kafka": 0.5, "load": 0.25}}
    assert (e2e.cpu_per_thousand(run), e2e.cpu_per_thousand(run, load=True)) == (0.75, 0.875)
    assert e2e.per_thousand_by_process(run) == {"ingest": 0.5, "kafka": 0.25, "load": 0.125}
