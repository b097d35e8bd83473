"""The start-up check of the groups' session against the brokers' bounds (app/group_session.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.group_session import KAFKA_BROKER_SESSION_MS, KAFKA_MAX_MS, KAFKA_MIN_MS, fragile, refusal

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


@given(MS, MS, st.integers(min_value=1, max_value=5))
def test_a_session_under_twice_the_brokers_is_fragile_only_with_replicated_offsets(
        session: int, broker: int, replicas: int) -> None:
    configs = {"broker.session.timeout.ms": str(broker), "offsets.topic.replication.factor": str(replicas)}
    warning = fragile(session, configs)
    assert (warning is None) == (session >= 2 * broker or replicas < 2)
    if warning is not None:
        assert f"ORDERLY_SESSION_TIMEOUT_MS={session} " in warning and f"timeout.ms={broker}:" in warning
        assert f"ORDERLY_SESSION_TIMEOUT_MS={2 * broker} or more" in warning
        assert f"broker.session.timeout.ms={session // 2} or less" in warning


def test_kafkas_broker_session_makes_the_10_s_default_fragile_and_the_embedded_clusters_does_not() -> None:
    assert KAFKA_BROKER_SESSION_MS == 9000
    assert fragile(10_000, {}) is not None  # Kafka's 9 s: a live worker may be expelled at a broker's loss
    assert fragile(18_000, {}) is None
    assert fragile(3000, {"broker.session.timeout.ms": "1500"}) is None  # app/stack/kafka.py SESSION_MS
    assert fragile(3000, {"broker.session.timeout.ms": "3000"}) is not None  # what expelled a worker
    assert fragile(3000, {"offsets.topic.replication.factor": "1"}) is None  # one broker: no follower
