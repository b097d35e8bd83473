"""app/sink.py's fetch pace: a sink whose polls found nothing for QUIET_AFTER_S asks the broker for
the first record at once and holds an empty fetch QUIET_FETCH's wait; one that took a batch goes back
to BUSY_FETCH's larger, shorter fetches at once; the pace is set only when it changes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from app import sink as sink_module
from app.seams import aiokafka as kafka_seam
from app.settings import DEV_DEFAULTS, Settings
from app.sink import BUSY_FETCH, QUIET_FETCH, PgSink


class Polls:
    """A started consumer's stand-in: each getmany returns the next of ``answers``; its fetcher
    records every pace it is given."""

    def __init__(self, answers: list[dict[str, list[Any]]]) -> None:
        self.answers = answers
        self._fetcher = SimpleNamespace(_fetch_min_bytes=BUSY_FETCH[0], _fetch_max_wait_ms=BUSY_FETCH[1])
        self.paces: list[tuple[int, int]] = []

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[str, list[Any]]:
        self.paces.append((self._fetcher._fetch_min_bytes, self._fetcher._fetch_max_wait_ms))
        return self.answers.pop(0)


def test_an_empty_poll_makes_the_fetches_quiet_and_a_batch_busy_again(monkeypatch: pytest.MonkeyPatch) -> None:
    sink = PgSink(Settings.from_env(DEV_DEFAULTS), "projector", "orderly.decisions", apply=None)  # type: ignore[arg-type]
    batch = {"tp": [SimpleNamespace(offset=0)]}
    consumer = Polls([{}, {}, {}, batch, batch, {}])
    sink.consumer, sink.pool = consumer, object()  # type: ignore[assignment]

    async def written(batch: Any) -> int:
        return 1

    sink._write = written  # type: ignore[method-assign]
    set_paces: list[tuple[int, int]] = []
    seam_set = kafka_seam.set_fetch_pace

    def counted(consumer: Any, min_bytes: int, max_wait_ms: int) -> None:
        set_paces.append((min_bytes, max_wait_ms))
        seam_set(consumer, min_bytes, max_wait_ms)

    monkeypatch.setattr(kafka_seam, "set_fetch_pace", counted)
    clock = [100.0]
    monkeypatch.setattr(sink_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))  # app.sink's clock only
    assert sink.quiet is False

    async def polls(gaps: list[float]) -> list[int]:
        found = []
        for gap in gaps:  # seconds on the clock before each poll
            clock[0] += gap
            found.append(await sink.run_once(timeout_ms=0))
        return found

    # empty, empty 0.5 s later (still busy: not QUIET_AFTER_S yet), empty 0.6 s later (quiet), a batch
    # (busy at once), a batch, an empty poll (busy: the end of a burst)
    consumer.answers += [{}]
    assert asyncio.run(polls([0, 0.5, 0.6, 0.1, 0.1, 0.1])) == [0, 0, 0, 1, 1, 0]
    # the pace each poll found (set after the poll before it)
    assert consumer.paces == [BUSY_FETCH, BUSY_FETCH, BUSY_FETCH, QUIET_FETCH, BUSY_FETCH, BUSY_FETCH]
    assert sink.quiet is False
    clock[0] += sink_module.QUIET_AFTER_S
    assert asyncio.run(polls([0])) == [0]  # a second empty poll, QUIET_AFTER_S after the first
    assert sink.quiet is True
    assert (consumer._fetcher._fetch_min_bytes, consumer._fetcher._fetch_max_wait_ms) == QUIET_FETCH
    assert set_paces == [QUIET_FETCH, BUSY_FETCH, QUIET_FETCH]  # only when it changes

