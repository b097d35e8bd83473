"""`orderly worker`: the Faust stream processor around the pure core (I/O shell)."""

from app.core.pacing import BUSY_BATCH
from app.worker.app import (
    BATCH_MAX,
    BUSY_COMMIT_RECORDS,
    BUSY_FETCH_MIN_BYTES,
    BUSY_INTERVAL_S,
    QUIET_S,
    SKIPPED_EXIT_CODE,
    STALLED_EXIT_CODE,
    TABLE,
    OffsetGuard,
    _ConsumerThread,
    build_app,
    changelog_topic,
    commit_due,
    fetch_min_bytes,
    next_commit_wait,
    run,
)

__all__ = ["BATCH_MAX", "BUSY_BATCH", "BUSY_COMMIT_RECORDS", "BUSY_FETCH_MIN_BYTES", "BUSY_INTERVAL_S", "QUIET_S",
           "SKIPPED_EXIT_CODE", "STALLED_EXIT_CODE", "TABLE", "OffsetGuard", "_ConsumerThread", "build_app",
           "changelog_topic", "commit_due", "fetch_min_bytes", "next_commit_wait", "run"]
