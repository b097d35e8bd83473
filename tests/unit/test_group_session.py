"""The start-up check of the groups' session against the brokers' bounds (app/group_session.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.group_session import KAFKA_MAX_MS, KAFKA_MIN_MS, refusal

MS = st.integers(min_value=1, max_value=10**8)


@given(MS, MS, MS)
def test_a_session_is_refused_exactly_outside_the_bounds_and_the_reason_names_what_to_change(
        session: int, low: int, high: int) -> None:
    reason = refusal(session, {"group.min.session.timeout.ms": str(low), "group.max.session.timeout.ms": str(high)})
    assert (reason is None) == (low <= session <= high)
    if reason is not None:
        assert f"ORDERLY_SESSION_TIMEOUT_MS={session}" in reason and "INVALID_SESSION_TIMEOUT" in reason
        assert (f"group.min.session.timeout.ms={session} (or less)" in reason) == (session < low)
        assert (f"at most {high}" in reason) == (session >= low)


def test_kafkas_defaults_refuse_the_3_s_default_and_name_both_ways_out() -> None:
    reason = refusal(3000, {})
    assert reason is not None
    assert f"group.min.session.timeout.ms={KAFKA_MIN_MS} .. group.max.session.timeout.ms={KAFKA_MAX_MS}" in reason
    assert "set group.min.session.timeout.ms=3000 (or less) on every broker" in reason
    assert "or ORDERLY_SESSION_TIMEOUT_MS=6000" in reason
    assert refusal(6000, {}) is None and refusal(3000, {"group.min.session.timeout.ms": "1000"}) is None
