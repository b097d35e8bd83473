"""The newest-first listing has one deadline, whether or not it reads again after a statement a
migration made stale (app/admin/resource_search.py _recent_in_snapshot): the second read gets what is left."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from app.admin import resource_search


class StaleLate:
    """A connection whose slices find nothing, each taking ``slice_s``; the third slice's statement
    was prepared before a migration."""

    def __init__(self, slice_s: float) -> None:
        self.slice_s = slice_s
        self.fetches = 0
        self.transactions = 0

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        self.transactions += 1
        yield

    def transaction(self, **kw: Any) -> Any:
        return self._transaction()

    async def fetch(self, *args: Any) -> list[Any]:
        self.fetches += 1
        await asyncio.sleep(self.slice_s)
        if self.fetches == 3:
            raise asyncpg.InvalidCachedStatementError("cached statement plan is invalid")
        return []


async def test_the_read_made_again_gets_what_is_left_of_the_one_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource_search, "LISTING_DEADLINE_S", 0.7)
    conn = StaleLate(slice_s=0.2)
    with pytest.raises(TimeoutError):
        await resource_search._recent_in_snapshot(conn, None, 51, None)  # type: ignore[arg-type]
    # three slices (0.6 s) then the read again: 0.1 s left, its first slice given up. With a deadline
    # of its own the second read would have read four slices more.
    assert conn.transactions == 2 and conn.fetches == 4
