"""The forked rebuild processes of a replay (app.replay._run_forked): their decisions are summed,
and one that fails or dies fails the whole rebuild, saying why (no Kafka: the work is replaced)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from app import replay
from app.settings import dev_settings


async def counted(target: Any, merged: Any, partitions: list[int]) -> int:
    return sum(partitions)


async def failing(target: Any, merged: Any, partitions: list[int]) -> int:
    if 1 in partitions:
        raise ValueError("boom in partition 1")
    return 1


async def dying(target: Any, merged: Any, partitions: list[int]) -> int:
    os._exit(9)


def test_the_processes_decisions_are_summed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay, "_rebuild_partitions", counted)
    assert replay._run_forked(dev_settings(), [[0, 2], [1, 3], [5]]) == 11


def test_a_failing_process_fails_the_rebuild_with_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay, "_rebuild_partitions", failing)
    with pytest.raises(RuntimeError, match="ValueError: boom in partition 1"):
        replay._run_forked(dev_settings(), [[0], [1]])


def test_a_process_that_dies_fails_the_rebuild(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay, "_rebuild_partitions", dying)
    with pytest.raises(RuntimeError, match="exit code 9"):
        replay._run_forked(dev_settings(), [[0], [1]])
