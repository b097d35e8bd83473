"""tests/parsing.py: a parse that lost CPython 3.11's race with another thread's is tried again;
any other SystemError, and a race lost every time, still fail."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis.internal.reflection import get_pretty_function_description

from tests import parsing


def flaky(failures: int, message: str = parsing.RACE) -> tuple[Callable[..., Any], list[str]]:
    real, calls = parsing._parse, list[str]()

    def parse(source: str, filename: str = "<unknown>", *args: Any, **kwargs: Any) -> Any:
        calls.append(source)
        if len(calls) <= failures:
            raise SystemError(f"{message} (before=120, after=139)")
        return real(source, filename, *args, **kwargs)

    return parse, calls


def test_a_lost_race_is_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    parse, calls = flaky(parsing.TRIES - 1)
    monkeypatch.setattr(parsing, "_parse", parse)
    tree = parsing.parse("x = 1\n")
    assert isinstance(tree.body[0], ast.Assign) and len(calls) == parsing.TRIES


def test_a_race_lost_every_time_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    parse, calls = flaky(parsing.TRIES)
    monkeypatch.setattr(parsing, "_parse", parse)
    with pytest.raises(SystemError, match=parsing.RACE):
        parsing.parse("x = 1\n")
    assert len(calls) == parsing.TRIES


def test_another_system_error_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    parse, calls = flaky(1, "something else")
    monkeypatch.setattr(parsing, "_parse", parse)
    with pytest.raises(SystemError, match="something else"):
        parsing.parse("x = 1\n")
    assert len(calls) == 1


def test_every_parse_of_the_test_process_is_the_retrying_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis describes a lambda by parsing its module with ``ast.parse``: that parse retries too,
    and keeps ``ast.parse``'s keywords."""
    assert ast.parse is parsing.any_parse
    parse, calls = flaky(2)
    monkeypatch.setattr(parsing, "_parse", parse)
    assert isinstance(ast.parse("f(x)", mode="eval"), ast.Expression) and len(calls) == 3


def test_hypothesis_describing_a_lambda_survives_a_lost_race(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The CI failure: Hypothesis parsed a test module to describe a lambda and met the race."""
    module = tmp_path / "strategy_module.py"
    module.write_text("double = (\n    lambda n: n * 2\n)\n")
    spec = importlib.util.spec_from_file_location("strategy_module", module)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    parse, calls = flaky(1)
    monkeypatch.setattr(parsing, "_parse", parse)
    assert get_pretty_function_description(loaded.double) == "lambda n: n * 2" and len(calls) >= 2
