"""The fetcher's request loop and a backfill that was not done: PostgreSQL away during the unmark is
waited for without asking the gateway again; an offset the group no longer lets it commit is not
the end of the process; a consumer that stops is."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiokafka.errors import CommitFailedError

from app import fetch_requests, fetcher
from app.fetcher import BackfillUnavailable, Fetcher
from app.settings import DEV_DEFAULTS, Settings
from projections import sql


class Conn:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def transaction(self) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def execute(self, query: str, *args: Any) -> None:
        self.pool.executed.append((query, args))


class Pool:
    """PostgreSQL away for the first ``away`` connections, then there."""

    def __init__(self, away: int) -> None:
        self.away = away
        self.executed: list[tuple[str, tuple[Any, ...]]] = []

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Conn]:
        if self.away:
            self.away -= 1
            raise ConnectionRefusedError("PostgreSQL is away")
        yield Conn(self)


def test_a_backfill_not_done_waits_for_postgresql_to_unmark_its_gap_and_asks_the_gateway_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings.from_env({**DEV_DEFAULTS, "ORDERLY_PG_API_URL": "http://127.0.0.1:9"})
    f = Fetcher(settings)
    f.pool = pool = Pool(away=2)  # type: ignore[assignment]
    asked: list[dict[str, Any]] = []
    waited: list[BaseException] = []

    async def backfill(gateway: Any, base: str, path: str, request: dict[str, Any]) -> int:
        asked.append(request)
        raise BackfillUnavailable("GET /v1/pay/events answered 503")

    async def wait(_pool: Any, _readiness: Any, exc: BaseException) -> None:
        waited.append(exc)

    monkeypatch.setattr(f, "backfill", backfill)
    monkeypatch.setattr(fetcher, "wait_for_postgres", wait)
    asyncio.run(f.carry_out({"gateway": "pg", "kind": "backfill", "since_sequence": 10, "until_sequence": 20}))
    assert len(asked) == 1 and len(waited) == 2
    assert pool.executed == [(sql.LOCK_SEQUENCES, ()), (sql.UNMARK_BACKFILLS_REQUESTED, ("pg", 11, 20))]


class Consumer:
    """One request, then the consumer stops; its commit refused as after a rebalance."""

    def __init__(self, *_: Any, **__: Any) -> None:
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    def __aiter__(self) -> AsyncIterator[Any]:
        async def one() -> AsyncIterator[Any]:
            yield SimpleNamespace(topic="orderly.fetch", partition=0, offset=7, value=orjson.dumps({"gateway": "pg"}))
        return one()

    async def commit(self) -> None:
        raise CommitFailedError("the group rebalanced")


def test_an_offset_the_group_refuses_is_not_the_end_but_a_stopped_consumer_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    carried: list[Any] = []

    async def carry_out(request: Any) -> None:
        carried.append(request)

    f = SimpleNamespace(producer=None, pool=None, readiness=None, metrics=None, requests=None, carry_out=carry_out)
    monkeypatch.setattr(fetch_requests, "AIOKafkaConsumer", Consumer)
    with pytest.raises(RuntimeError, match="consumer stopped"):
        asyncio.run(fetch_requests.consume_fetch_requests(f, Settings.from_env(DEV_DEFAULTS)))
    assert carried == [{"gateway": "pg"}] and f.requests.stopped
