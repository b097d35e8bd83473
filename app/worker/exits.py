"""When and how the worker ends itself for its supervisor to restart it (I/O shell)."""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("orderly.worker")

# The codes a worker exits with, so that its supervisor and the operator know why (docs/operations.md).
STALLED_EXIT_CODE, FAILED_EXIT_CODE, SKIPPED_EXIT_CODE = 3, 4, 5
# Rewinds of one partition in a row, no record decided between, before the worker gives up on
# mending a skip and ends for its supervisor: a batch of records fetched before the rewind and
# handed over after it asks for one more (the worker's stall check, app/liveness.py, bounds it in time).
REWINDS_MAX = 1000


class OffsetGuard:
    """Notices records Faust never handed to the agent, and records it hands over again.

    Skipped records were seen after restarts, most with exactly-once (whose recovery waits while
    the fetcher runs), so the state missed updates whose decisions were out. Faust's code suggests
    how: its fetch loop sets a partition's read offset after each record it hands over, so a seek to
    the committed offsets (at the end of every recovery) that lands meanwhile is undone, and the
    records in between are dropped as already read. orderly.raw is never compacted nor written in
    transactions, so its offsets have no holes: a record beyond the offset after the highest handed
    over so far (the committed one, before the first) means records were skipped.

    A skip is mended where it is found: the partition is fetched again from the first record
    skipped (``rewound``), and the records after it wait for their turn; a process ends for its
    supervisor only when that cannot be done (REWINDS_MAX rewinds of a partition in a row with no
    record decided in between, or a seek refused).

    Records handed over again (after such a seek) were decided already in this assignment, and
    their outputs are durable (at-least-once) or in the partition's open transaction
    (exactly-once), or they are below the committed offset: they are acked, not decided again
    (exactly-once would otherwise commit their decisions twice)."""

    def __init__(self) -> None:
        self.high: dict[Any, int] = {}  # partition -> one past the highest offset handed over
        self.rewinds: dict[Any, int] = {}  # partition -> rewinds in a row, no record decided between

    def forget(self, tps: Any) -> None:
        for tp in tps:
            self.high.pop(tp, None)
            self.rewinds.pop(tp, None)

    def rewound(self, tp: Any, to: int) -> bool:
        """``tp`` is fetched again from ``to`` (the first record skipped): the record expected next.
        False once it was rewound REWINDS_MAX times in a row without a record in order between."""
        self.high[tp] = to
        self.rewinds[tp] = self.rewinds.get(tp, 0) + 1
        return self.rewinds[tp] <= REWINDS_MAX

    def needs_start(self, tp: Any, committed: int | None) -> bool:
        """Whether the next record of ``tp`` is its first in this assignment and Faust does not know
        where it starts: Faust keeps no committed offset for a partition its group never committed
        (nor for one committed at 0), and the record Faust skipped there was the partition's first."""
        return committed is None and tp not in self.high

    def check(self, tp: Any, offset: int, committed: int | None,
              start: int | None = None) -> tuple[bool, int | None]:
        """Whether ``offset`` of ``tp`` was handed over before (or is below ``committed``), and the
        first offset skipped before it, or None; ``committed`` is where the partition's first
        record is expected (None: unknown). With ``committed`` unknown, ``start`` is where the
        consumer began reading (the group's committed offset from the broker, or the partition's
        earliest): a first record beyond it is a skip, one at or below it is the start (records below
        ``start`` are not taken as decided when only the broker says so)."""
        high = self.high.get(tp, committed)
        self.high[tp] = offset + 1 if high is None else max(high, offset + 1)
        if high is None or offset == high:
            self.rewinds.pop(tp, None)  # a record in order: the partition moves on
        if high is None:
            return False, (start if start is not None and offset > start else None)
        return offset < high, (high if offset > high else None)


def exit_for_restart(code: int, message: str, *args: Any, exc_info: bool = False) -> None:
    """Log why and end the process at once, nothing acked: its supervisor starts it again, and it
    resumes from the committed offsets with the state recovered from Kafka."""
    log.critical(message, *args, exc_info=exc_info)
    logging.shutdown()
    os._exit(code)
