"""app/readiness.py: what a process's /readyz says while it waits for PostgreSQL (the waiting itself
under a real outage: tests/chaos/test_postgres_faults.py)."""

from __future__ import annotations

import asyncpg
from hypothesis import given
from hypothesis import strategies as st

from app.readiness import REASON_CHARS, UNREACHABLE, Readiness

ERRORS = st.sampled_from([ConnectionRefusedError(111, "Connection refused"),
                          asyncpg.CannotConnectNowError("the database system is shutting down"),
                          asyncpg.exceptions.AdminShutdownError("terminating connection"),
                          TimeoutError("no answer")])


def test_ready_until_told_otherwise() -> None:
    assert Readiness().answer() == (200, {"ready": True})


@given(st.lists(st.tuples(st.sampled_from(["postgres", "kafka"]), st.none() | ERRORS), max_size=30))
def test_not_ready_exactly_while_something_is_waited_for_with_its_last_reason(
        steps: list[tuple[str, BaseException | None]]) -> None:
    readiness, last = Readiness(), dict[str, BaseException]()
    for what, exc in steps:
        if exc is None:
            readiness.up(what)
            last.pop(what, None)
        else:
            readiness.down(what, exc)
            last[what] = exc
    status, body = readiness.answer()
    assert status == (503 if last else 200)
    if last:
        waiting = body["waiting_for"]
        assert isinstance(waiting, dict) and set(waiting) == set(last)
        for what, exc in last.items():
            assert waiting[what]["reason"] == f"{type(exc).__name__}: {exc}"[:REASON_CHARS]
            assert waiting[what]["for_s"] >= 0


def test_the_outage_is_timed_from_its_first_failure() -> None:
    readiness = Readiness()
    readiness.down("postgres", ConnectionRefusedError(111, "refused"))
    since = readiness.waiting["postgres"][0]
    readiness.down("postgres", asyncpg.CannotConnectNowError("starting up"))
    assert readiness.waiting["postgres"] == (since, "CannotConnectNowError: starting up")


def test_the_server_going_away_is_unreachable_not_a_records_fault() -> None:
    """A fast shutdown's 57P01 and a rollback on a reset connection are PostgreSQL away: the sink
    waits for it instead of setting the batch's records aside."""
    for exc in (asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
                asyncpg.CannotConnectNowError("the database system is starting up"),
                asyncpg.InternalClientError("cannot switch to state 15"), ConnectionResetError()):
        assert isinstance(exc, UNREACHABLE)
    for fault in (asyncpg.UniqueViolationError("duplicate"), asyncpg.DataError("bad"), ValueError("bad")):
        assert not isinstance(fault, UNREACHABLE)
