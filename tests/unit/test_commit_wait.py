"""The wait between the worker's commits (app.worker.consumer.next_commit_wait, commit_due) and its settings: the commit
interval after a commit that covered few records, the busy interval after a busy one, and the busy
interval never shorter than the commit interval."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.settings import BUSY_COMMIT_INTERVAL_S, COMMIT_INTERVAL_S, TRANSACTION_TIMEOUT_S, Settings, dev_settings
from app.worker.consumer import BUSY_COMMIT_RECORDS, commit_due, next_commit_wait, quiet_after

BUSY_INTERVAL_S = dev_settings({}).worker_busy_interval_s  # the default pause between busy batches
QUIET_S = quiet_after(BUSY_INTERVAL_S)

intervals = st.floats(min_value=0.001, max_value=10, allow_nan=False)


@given(st.integers(min_value=0, max_value=10**6), intervals, intervals)
def test_a_busy_commit_is_followed_by_the_busy_interval(covered: int, interval: float, busy: float) -> None:
    wait = next_commit_wait(covered, interval, busy)
    assert wait == (busy if covered >= BUSY_COMMIT_RECORDS else interval)


def test_the_threshold() -> None:
    assert next_commit_wait(BUSY_COMMIT_RECORDS - 1, 0.05, 0.3) == 0.05  # 500 webhooks/s: latency first
    assert next_commit_wait(BUSY_COMMIT_RECORDS, 0.05, 0.3) == 0.3


def test_defaults_per_guarantee() -> None:
    eos = dev_settings({"ORDERLY_PROCESSING_GUARANTEE": "exactly_once"})
    assert (eos.worker_commit_interval_s, eos.worker_busy_commit_interval_s) == (
        COMMIT_INTERVAL_S["exactly_once"], BUSY_COMMIT_INTERVAL_S["exactly_once"])
    alos = dev_settings({})
    assert alos.processing_guarantee == "at_least_once"
    assert alos.worker_busy_commit_interval_s == alos.worker_commit_interval_s == 2.8


# exactly-once accepts commit intervals up to half its transaction timeout (app/settings.py)
exactly_once_intervals = st.floats(min_value=0.001, max_value=TRANSACTION_TIMEOUT_S / 2, allow_nan=False)


@given(exactly_once_intervals, exactly_once_intervals)
def test_the_busy_interval_is_never_shorter_than_the_interval(interval: float, busy: float) -> None:
    settings = dev_settings({"ORDERLY_PROCESSING_GUARANTEE": "exactly_once",
                                  "ORDERLY_COMMIT_INTERVAL_S": str(interval),
                                  "ORDERLY_BUSY_COMMIT_INTERVAL_S": str(busy)})
    assert settings.worker_commit_interval_s == interval
    assert settings.worker_busy_commit_interval_s == max(interval, busy)
    assert Settings.from_env(settings.to_env()).worker_busy_commit_interval_s == max(interval, busy)


@given(st.floats(min_value=0, max_value=10), intervals, st.floats(min_value=0, max_value=10))
def test_a_commit_is_due_after_the_wait_or_once_the_flow_stopped(since_commit: float, wait: float,
                                                                  since_batch: float) -> None:
    assert commit_due(since_commit, wait, since_batch, QUIET_S) == (since_commit >= wait or since_batch >= QUIET_S)


def test_a_busy_worker_between_batches_is_not_quiet() -> None:
    assert QUIET_S > BUSY_INTERVAL_S  # its pause between batches does not count as the end of the flow
    assert not commit_due(0.1, 0.3, BUSY_INTERVAL_S, QUIET_S)
    assert commit_due(0.1, 0.3, QUIET_S, QUIET_S)  # the flow stopped: its tail is committed now
