"""Readiness of the processes that serve only /metrics (projector, effects, fetcher), and how they
wait for PostgreSQL (I/O shell).

PostgreSQL out of reach is not a crash: the process keeps its Kafka group membership, answers 503 on
/readyz (beside /metrics, on ORDERLY_METRICS_PORT) naming what it waits for and why, asks
PostgreSQL again every second, and resumes where its stored offsets say once it answers. A restart
would gain nothing (its start needs PostgreSQL too) and would cost a rebalance of its group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import asyncpg

from app.waits import within

log = logging.getLogger("orderly.readiness")

# PostgreSQL out of reach, as asyncpg and the socket say it: refused or reset connections, a
# connection the server closed, and the server's own "shutting down" / "starting up" answers (57P01,
# 57P02, 57P03: OperatorInterventionError), which are about the server, never about a record; and
# asyncpg's InternalClientError, which a transaction's rollback on a connection reset mid-query raises
# in place of the reset (seen at a kill -9: "cannot switch to state 15; another operation is in progress").
UNREACHABLE = (OSError, TimeoutError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
               asyncpg.exceptions.OperatorInterventionError, asyncpg.TooManyConnectionsError,
               asyncpg.InternalClientError)
RETRY_S = 1.0  # how often a waiting process asks PostgreSQL again
PROBE_DEADLINE_S = 2.0  # DESIGN.md §3: readiness is an answer now, within 2 s
REASON_CHARS = 300


@dataclass
class Readiness:
    """What a process waits for (``postgres``), since when, and why; ready when it waits for nothing."""

    waiting: dict[str, tuple[float, str]] = field(default_factory=dict)  # what -> (since, why)

    def down(self, what: str, exc: BaseException) -> None:
        why = f"{type(exc).__name__}: {exc}"[:REASON_CHARS]
        if what not in self.waiting:
            log.warning("waiting for %s: %s", what, why)
        self.waiting[what] = (self.waiting.get(what, (time.time(), ""))[0], why)

    def up(self, what: str) -> None:
        if (was := self.waiting.pop(what, None)) is not None:
            log.warning("%s is back after %.1f s; resuming", what, time.time() - was[0])

    def answer(self, public: bool = False) -> tuple[int, dict[str, object]]:
        """/readyz's status and body: 200 ``{"ready": true}``, or 503 naming each thing waited for;
        ``public`` (a /readyz without a credential): the error's type only, its text (an address, a
        user name) in the log alone."""
        if not self.waiting:
            return 200, {"ready": True}
        now = time.time()
        return 503, {"ready": False, "waiting_for": {what: {"reason": why.partition(":")[0] if public else why,
                                                            "for_s": round(now - since, 1)}
                                                      for what, (since, why) in self.waiting.items()}}


async def wait_for_postgres(pool: asyncpg.Pool, readiness: Readiness, exc: BaseException) -> None:
    """Not ready (``exc`` says why) until PostgreSQL answers ``SELECT 1`` through ``pool`` again: the
    pool drops the connections the outage broke and opens new ones."""
    readiness.down("postgres", exc)
    while True:
        await asyncio.sleep(RETRY_S)
        try:
            await within(pool.fetchval("SELECT 1"), PROBE_DEADLINE_S)
        except UNREACHABLE as again:
            readiness.down("postgres", again)
            continue
        readiness.up("postgres")
        return
