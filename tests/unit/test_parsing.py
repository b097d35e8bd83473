"""tests/parsing.py: a parse that lost CPython 3.11's race with another thread's is tried again;
any other SystemError, and a race lost every time, still fail."""

from __future__ import annotations

import ast
from collections.abc import Callable

import pytest

from tests import parsing


def flaky(failures: int, message: str = parsing.RACE) -> tuple[Callable[..., ast.Module], list[str]]:
    real, calls = ast.parse, list[str]()

    def parse(source: str, filename: str = "<unknown>") -> ast.Module:
        calls.append(source)
        if len(calls) <= failures:
            raise SystemError(f"{message} (before=120, after=139)")
        return real(source, filename)

    return parse, calls


def test_a_lost_race_is_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    parse, calls = flaky(parsing.TRIES - 1)
    monkeypatch.setattr(ast, "parse", parse)
    tree = parsing.parse("x = 1\n")
    assert isinstance(tree.body[0], ast.Assign) and len(calls) == parsing.TRIES


def test_a_race_lost_every_time_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    parse, calls = flaky(parsing.TRIES)
    monkeypatch.setattr(ast, "parse", parse)
    with pytest.raises(SystemError, match=parsing.RACE):
        parsing.parse("x = 1\n")
    assert len(calls) == parsing.TRIES


def test_another_system_error_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    parse, calls = flaky(1, "something else")
    monkeypatch.setattr(ast, "parse", parse)
    with pytest.raises(SystemError, match="something else"):
        parsing.parse("x = 1\n")
    assert len(calls) == 1
