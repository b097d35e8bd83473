"""The PostgreSQL store deciding pg's correlation PUTs, a batch at a time (I/O shell).

A claim is new or identical to what is stored (200), or conflicts (409): another mapping for its
deposit, or its merchant reference stored for another deposit. The claims that arrive while one
batch is decided are decided together next (a group commit): one ``INSERT … ON CONFLICT DO NOTHING
RETURNING`` of them all and, for those not inserted, one ``SELECT``. A statement per PUT cost the
ingest and PostgreSQL more than the rest of the PUT. Each answer is the one the claim would get alone.

What can go wrong, and what each caller is told:
- PostgreSQL away, slow past a claim's deadline, or refusing the batch for a reason of its own (a
  lock or statement timeout, read-only after a failover, too many connections): 503 for every claim
  of the batch, logged and counted.
- Two ingests deciding batches of the same deposits can deadlock on their rows: each batch goes in
  deposit order, which avoids it on the deposits, and a batch PostgreSQL picks as the victim is
  decided once more (the reference's index can still cross).
- A claim whose own values PostgreSQL refuses (none is known: the route checks every id first)
  fails alone: the rest of its batch is decided again, one at a time, within the batch's deadline.
- More than ``WAITING_MAX`` claims waiting (PostgreSQL far slower than the PUTs): 503 at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

import asyncpg

from app import pg_pool
from app.ingest.answers import Unavailable
from app.metrics import IngestMetrics
from topics.records import Correlation

log = logging.getLogger("orderly.ingest")

CLAIMS_AT_ONCE = 256  # claims decided in one statement at most
WAITING_MAX = 8 * CLAIMS_AT_ONCE  # claims waiting past this are answered 503 at once
_COLUMNS = "pg_deposit_id, merchant_reference, our_order_id, our_user_id"
# One statement for a batch: a row whose deposit or reference is stored already, or comes earlier in
# the same batch, is skipped (ON CONFLICT DO NOTHING skips a conflict within the statement too).
INSERT_CLAIMS = (f"INSERT INTO pg_deposit_correlations ({_COLUMNS}) "
                 "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) "
                 f"ON CONFLICT DO NOTHING RETURNING {_COLUMNS}")
# A statement of its own, after the insert: in READ COMMITTED it sees a row another connection
# committed while the insert waited for it, which the insert's own snapshot would not.
STORED_CLAIMS = f"SELECT {_COLUMNS} FROM pg_deposit_correlations WHERE pg_deposit_id = ANY($1::text[])"
UNREACHABLE_HERE = (OSError, TimeoutError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
                    asyncpg.InterfaceError)
# what one claim's own values can make PostgreSQL refuse; any other refusal is the batch's
THE_CLAIMS_OWN = (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError)
Claimed = tuple[str, str, str, str]  # a correlation's fields, in the table's column order


class Waiting:
    __slots__ = ("claim", "deadline", "decided")

    def __init__(self, claim: Correlation, decided: asyncio.Future[bool], deadline: float) -> None:
        self.claim, self.decided, self.deadline = claim, decided, deadline


def _fields(c: Correlation) -> Claimed:
    return c.pg_deposit_id, c.merchant_reference, c.our_order_id, c.our_user_id


def _copy(exc: Exception) -> Exception:
    """``exc`` for one more caller to raise: an Unavailable of its own, with the same cause (the
    route answers from it), not one instance whose traceback every caller would extend."""
    if isinstance(exc, Unavailable):
        copy = Unavailable(str(exc))
        copy.__cause__ = exc.__cause__
        return copy
    return exc


class CorrelationStore:
    """Decides 200/409 for correlation PUTs atomically in PostgreSQL (unique on both ids)."""

    def __init__(self, dsn: str, schema: str, metrics: IngestMetrics | None = None) -> None:
        self.dsn = dsn
        self.schema = schema
        self.metrics = metrics
        self._pool: asyncpg.Pool | None = None
        self._creating: asyncio.Future[asyncpg.Pool] | None = None
        self._waiting: deque[Waiting] = deque()
        self._deciding: asyncio.Task[None] | None = None

    async def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            # One creation shared by concurrent first callers (two would each open a pool and leak
            # one), shielded so that a caller's deadline does not cancel it half-way.
            if self._creating is None:
                self._creating = asyncio.ensure_future(self._create_pool())
            creating = self._creating
            try:
                self._pool = await asyncio.shield(creating)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                raise Unavailable(f"postgres unreachable: {exc}") from exc
            finally:
                if creating.done():
                    self._creating = None
        return self._pool

    async def _create_pool(self) -> asyncpg.Pool:
        return await pg_pool.create_pool(self.dsn, self.schema, min_size=1, max_size=4, timeout=3)

    async def claim(self, c: Correlation, timeout_s: float) -> bool:
        """True if the mapping is new or identical; False if it conflicts with a stored one.
        Unavailable when PostgreSQL does not decide it within ``timeout_s``."""
        if len(self._waiting) >= WAITING_MAX:
            self._count("busy")
            raise Unavailable(f"postgres unavailable: {len(self._waiting)} correlations waiting already")
        loop = asyncio.get_running_loop()
        decided: asyncio.Future[bool] = loop.create_future()
        self._waiting.append(Waiting(c, decided, loop.time() + timeout_s))
        self._gauge()
        if self._deciding is None or self._deciding.done():
            self._deciding = asyncio.create_task(self._decide_waiting())
        try:
            async with asyncio.timeout(timeout_s):  # cancels ``decided``: its batch leaves it out
                return await decided
        except TimeoutError as exc:
            raise Unavailable(f"postgres unavailable: TimeoutError {exc}") from exc

    async def _decide_waiting(self) -> None:
        """Decide the waiting claims, a batch at a time, until none waits."""
        loop = asyncio.get_running_loop()
        while self._waiting:
            batch: list[Waiting] = []
            while self._waiting and len(batch) < CLAIMS_AT_ONCE:
                waiting = self._waiting.popleft()
                if not waiting.decided.done() and waiting.deadline > loop.time():  # its caller waits still
                    batch.append(waiting)
            self._gauge()
            if not batch:
                continue
            try:
                # the latest deadline: a claim whose own passes first is answered 503 by its caller
                await self._decide_batch(batch, max(w.deadline for w in batch))
            except BaseException:  # the ingest stopping (or a bug): the batch under way is answered now
                self._answer(batch, Unavailable("postgres unavailable: the ingest is stopping"), "unavailable")
                raise

    async def _decide_batch(self, batch: list[Waiting], deadline: float) -> None:
        outcome = "decided"
        try:
            try:
                results = await self._decide([w.claim for w in batch], deadline)
            except asyncpg.TransactionRollbackError:  # a deadlock's victim: decided once more
                outcome = "again"
                results = await self._decide([w.claim for w in batch], deadline)
        except THE_CLAIMS_OWN as exc:
            if len(batch) == 1:
                self._answer(batch, exc, "refused")
                return
            log.warning("a correlation batch of %d refused by PostgreSQL (%s: %s); deciding its claims one "
                        "at a time", len(batch), type(exc).__name__, exc)
            self._count("alone")
            for waiting in batch:
                if not waiting.decided.done():  # its caller waits still
                    await self._decide_batch([waiting], deadline)
            return
        except Exception as exc:  # PostgreSQL away or refusing the batch: 503 for each of its claims
            failed = exc if isinstance(exc, Unavailable) else Unavailable(
                f"postgres unavailable: {type(exc).__name__} {exc}")
            if failed is not exc:
                failed.__cause__ = exc
            log.warning("a correlation batch of %d not decided: %s", len(batch), failed)
            self._answer(batch, failed, "unavailable")
            return
        for waiting, result in zip(batch, results, strict=True):
            if not waiting.decided.done():
                waiting.decided.set_result(result)
        self._count(outcome)
        if self.metrics is not None:
            self.metrics.correlation_batch_size.observe(len(batch))

    def _answer(self, batch: list[Waiting], exc: Exception, outcome: str) -> None:
        for waiting in batch:
            if not waiting.decided.done():
                waiting.decided.set_exception(_copy(exc))
        self._count(outcome)

    async def _decide(self, claims: list[Correlation], deadline: float) -> list[bool]:
        pool = await self.pool()
        fields = [_fields(c) for c in claims]
        # in deposit order (a stable sort: the earlier of two claims of a deposit first): two ingests'
        # batches then take the deposits' rows in the same order, and do not deadlock on them
        ordered = sorted(fields, key=lambda f: f[0])
        try:
            async with asyncio.timeout_at(deadline), pool.acquire() as conn:
                inserted = {tuple(r) for r in await conn.fetch(INSERT_CLAIMS, *map(list, zip(*ordered, strict=True)))}
                rest = [f[0] for f in fields if f not in inserted]
                stored = {r[0]: tuple(r) for r in await conn.fetch(STORED_CLAIMS, rest)} if rest else {}
        except UNREACHABLE_HERE as exc:
            raise Unavailable(f"postgres unavailable: {type(exc).__name__} {exc}") from exc
        # no row for a deposit: its merchant_reference belongs to another deposit
        return [f in inserted or stored.get(f[0]) == f for f in fields]

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.correlation_batches.labels(outcome).inc()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.correlations_waiting.set(len(self._waiting))

    async def probe(self) -> None:
        """SELECT 1 now, on a pooled connection (no new connection per probe)."""
        pool = await self.pool()
        if await pool.fetchval("SELECT 1") != 1:
            raise Unavailable("postgres answered SELECT 1 wrongly")

    async def close(self) -> None:
        deciding = self._deciding
        if deciding is not None and not deciding.done():
            deciding.cancel()
            await asyncio.gather(deciding, return_exceptions=True)
        while self._waiting:  # answered now, not at their deadline
            waiting = self._waiting.popleft()
            if not waiting.decided.done():
                waiting.decided.set_exception(Unavailable("postgres unavailable: the ingest is stopping"))
        if self._pool is not None:
            await self._pool.close()
