"""Each embedded stack's credentials are its own: random, valid for their settings, printed, and
kept in a stack.json created mode 0600 where `orderly simulate` and the operator commands find them
(app/stack/credentials.py, app/supervisor.py; issue #45)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from app import cli
from app.settings import DEV_DEFAULTS, Settings
from app.settings_operator import operator_settings, stack_credentials
from app.stack import credentials
from app.supervisor import Stack

BASE = {"ORDERLY_KAFKA": "127.0.0.1:29092"}


def _stack(tmp_path: Path, name: str, **env: str) -> tuple[Stack, dict[str, str]]:
    settings, made = credentials.stack_settings({**BASE, "ORDERLY_DATA_DIR": str(tmp_path / name), **env})
    stack = Stack(settings)
    stack.data_dir.mkdir(parents=True, exist_ok=True)
    return stack, made


def test_two_stacks_get_different_credentials_none_of_them_a_development_default(tmp_path: Path) -> None:
    one, made_one = _stack(tmp_path, "one")
    two, made_two = _stack(tmp_path, "two")
    names = set(credentials.credential_names())
    assert {"ORDERLY_ADMIN_TOKEN", "ORDERLY_API_TOKEN", "ORDERLY_EFFECTS_SECRET", "ORDERLY_SECRET_PG",
            "ORDERLY_SECRET_CARD", "ORDERLY_SECRET_ADYEN"} <= names
    assert "ORDERLY_POSTGRES_DSN" not in names and "ORDERLY_ADMIN_TOKEN" not in DEV_DEFAULTS
    assert set(made_one) == set(made_two) == names
    for name in names:
        assert made_one[name] != made_two[name], name
        assert made_one[name] != DEV_DEFAULTS.get(name), name
    # the settings took them (each passed its own check: card's base64, adyen's hex)
    assert one.settings.admin_token is not None and one.settings.admin_token.reveal() == made_one["ORDERLY_ADMIN_TOKEN"]
    assert one.settings.api_token.reveal() == made_one["ORDERLY_API_TOKEN"]
    assert one.settings.secrets["card"].reveal() == (made_one["ORDERLY_SECRET_CARD"],)
    assert one.settings.secrets["adyen"].reveal() == (made_one["ORDERLY_SECRET_ADYEN"],)
    assert two.settings.admin_token is not None and two.settings.admin_token.reveal() == made_two["ORDERLY_ADMIN_TOKEN"]
    # and every child process gets them
    assert {c.env["ORDERLY_ADMIN_TOKEN"] for c in one.children} == {made_one["ORDERLY_ADMIN_TOKEN"]}
    assert len(made_one["ORDERLY_ADMIN_TOKEN"]) >= 40


def test_the_environment_keeps_what_it_sets(tmp_path: Path) -> None:
    stack, made = _stack(tmp_path, "set", ORDERLY_API_TOKEN="mine-and-only-mine")
    assert "ORDERLY_API_TOKEN" not in made and stack.settings.api_token.reveal() == "mine-and-only-mine"
    assert "ORDERLY_ADMIN_TOKEN" in made


def test_the_stack_file_is_created_mode_0600_and_holds_the_credentials(tmp_path: Path) -> None:
    stack, made = _stack(tmp_path, "file")
    old = os.umask(0)  # the mode is the file's own, not the umask's doing
    try:
        stack.write_stack_file()
    finally:
        os.umask(old)
    assert stat.S_IMODE(stack.stack_file.stat().st_mode) == 0o600
    described = json.loads(stack.stack_file.read_text())
    assert described["credentials"] == {name: made[name] for name in made}
    stack.write_stack_file()  # rewritten (a restarted child's new pid): still 0600, nothing left beside it
    assert stat.S_IMODE(stack.stack_file.stat().st_mode) == 0o600
    assert [p.name for p in stack.data_dir.iterdir() if p.is_file()] == ["stack.json"]


def test_operator_commands_and_the_simulator_use_the_running_stacks_credentials(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack, made = _stack(tmp_path, "running")
    stack.write_stack_file()
    env = {"ORDERLY_DATA_DIR": str(stack.data_dir)}
    assert stack_credentials(env) == made
    found = operator_settings(env)
    assert found.api_token.reveal() == made["ORDERLY_API_TOKEN"]
    assert found.secrets["pg"].reveal() == (made["ORDERLY_SECRET_PG"],)
    assert operator_settings({**env, "ORDERLY_API_TOKEN": "from-env"}).api_token.reveal() == "from-env"
    assert stack_credentials({"ORDERLY_DATA_DIR": str(tmp_path / "none")}) == {}
    seen: list[str] = []
    def simulate(settings: Settings, args: object) -> int:
        seen.append(settings.secrets["pg"].reveal()[0])
        return 0

    monkeypatch.setattr("app.simulator.cli.run", simulate)
    monkeypatch.setenv("ORDERLY_DATA_DIR", str(stack.data_dir))
    monkeypatch.delenv("ORDERLY_SECRET_PG", raising=False)
    assert cli.main(["simulate", "--target", "http://127.0.0.1:1"]) == 0
    assert seen == [made["ORDERLY_SECRET_PG"]]


def test_dev_prints_the_credentials_it_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    given: list[dict[str, str]] = []

    def run_dev(settings: object, brokers: int = 1, workers: int = 1, made: dict[str, str] | None = None) -> int:
        given.append(made or {})
        print(credentials.announce(made or {}, tmp_path / "stack.json"))
        return 0

    monkeypatch.setattr("app.supervisor.run_dev", run_dev)
    monkeypatch.setenv("ORDERLY_DATA_DIR", str(tmp_path))
    for name in credentials.credential_names():
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["dev"]) == 0 and cli.main(["dev"]) == 0
    out = capsys.readouterr().out
    assert given[0]["ORDERLY_ADMIN_TOKEN"] != given[1]["ORDERLY_ADMIN_TOKEN"]
    assert f"ORDERLY_ADMIN_TOKEN={given[0]['ORDERLY_ADMIN_TOKEN']}" in out and "mode 0600" in out
