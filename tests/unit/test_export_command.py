"""`orderly export`'s answers before and without Kafka: a topic that is not a projection, and a
Kafka that is not there, each one line on stderr with its exit code (no traceback)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from app.cli import main
from app.export import run
from app.stack.process import spare_port
from tests.support import make_settings


def args(topic: str, target: Path) -> argparse.Namespace:
    return argparse.Namespace(topic=topic, to=target, row_group=100)


def test_a_topic_that_is_not_a_projection_is_refused_in_one_line(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    settings = make_settings("127.0.0.1:9", "postgresql://u@127.0.0.1:9/db", "ns")
    assert run(settings, args("raw", tmp_path / "x.parquet")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--topic must be one of state, decisions, facts, effects" in err
    assert not (tmp_path / "x.parquet").exists()


def test_kafka_unreachable_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = make_settings(f"127.0.0.1:{spare_port()}", "postgresql://u@127.0.0.1:9/db", "ns")
    assert run(settings, args("ns.decisions", tmp_path / "x.parquet")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("orderly export: Kafka at 127.0.0.1:"), err
    assert not list(tmp_path.iterdir())  # no partial file left behind


def test_the_command_is_wired(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["export", "--help"])
    assert exited.value.code == 0
    assert "--topic" in capsys.readouterr().out
