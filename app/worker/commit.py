"""One commit of the worker's consumer, its steps in their fixed order (I/O shell).

Faust's consumer asks for a commit on its timer (app/seams/faust/consumer.py); ``Commit.run`` is
that commit. At-least-once it is Faust's own (the outputs and the changelog were acknowledged
before the offsets were decided). With exactly-once:

1. take the decided offsets and the group membership they belong to, in one step;
2. refuse offsets decided in another generation of the group than the one now;
3. flush the stage: every write of the batches those offsets cover acknowledged in the open
   transactions, new writes held from now on; partitions revoked meanwhile are left out;
4. one transaction for every partition: refuse writes of partitions whose offsets it leaves out;
5. commit the offsets and the transactions (Faust, through the seam's TransactionManager, with the
   membership of step 1 pinned);
6. the local store takes the committed partitions' values and changelog offsets;
7. the stage sends the held writes into the new transactions.

A failure anywhere in 2-5 ends the worker: Faust would crash the app, and its stop would commit
once more, the offsets without the writes that just failed. So does a commit still unfinished
COMMIT_DEADLINE_S after it began: the broker aborts a transaction TRANSACTION_TIMEOUT_S after it
began, so it can no longer succeed, and every later commit, a revocation's and a stop's included,
waits for it (a CI run once saw one wait with no end: the worker took no part in its group any
more and ignored SIGTERM). At-least-once, an offset commit unfinished OFFSET_COMMIT_DEADLINE_S after
it began ends the worker too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from faust.types import TP

from app.seams.aiokafka import FencedMemberError
from app.seams.faust import CommittingConsumer
from app.settings import TRANSACTION_TIMEOUT_S, WORKER_REQUEST_TIMEOUT_S
from app.worker.consumer import next_commit_wait
from app.worker.exits import FAILED_EXIT_CODE, exit_for_restart
from app.worker.shared import WorkerState

COMMIT_DEADLINE_S = 3 * TRANSACTION_TIMEOUT_S
# At-least-once, an offset commit (and Faust's flush of the changelog before it) retries for as long
# as Kafka answers that it may (aiokafka's coordinator, on a retriable error), and the stop's last
# commit waits for it. A coordinator whose machine vanished without a reset is noticed after one
# request timeout and the retry at the new one answers within the next: past two and a margin, the
# commit will not end, and the worker exits to be restarted; it decides again from the last committed
# offsets (the outputs' dedupe absorbs the repeats).
OFFSET_COMMIT_DEADLINE_S = 2 * WORKER_REQUEST_TIMEOUT_S + 20.0


class Commit:
    """Runs the worker's commits, and remembers how many records the last one covered (the wait
    before the next commit depends on it)."""

    def __init__(self, state: WorkerState, one_transaction: bool) -> None:
        self.state = state
        self.one_transaction = one_transaction  # exactly-once under the worker's own transactional id
        self.covered = 0  # records the last commit covered

    async def run(self, consumer: CommittingConsumer, offsets: Mapping[TP, int],
                  start_new_transaction: bool = True) -> bool:
        started = time.perf_counter()
        before = consumer.committed_offsets()
        if self.state.stage is None or not consumer.in_transaction:
            did_commit = await self.offsets_only(consumer, offsets, start_new_transaction)
        else:
            offsets, did_commit = await self.exactly_once(consumer, start_new_transaction)
        if did_commit:  # how busy the worker is: the wait before the next commit depends on it
            self.covered = sum(offset - previous for tp, offset in offsets.items()
                               if (previous := before.get(tp)) is not None)
        self.state.metrics.commit_seconds.observe(time.perf_counter() - started)
        return did_commit

    async def offsets_only(self, consumer: CommittingConsumer, offsets: Mapping[TP, int],
                           start_new_transaction: bool) -> bool:
        """Faust's commit of the offsets alone (at-least-once), within OFFSET_COMMIT_DEADLINE_S."""
        deadline = asyncio.timeout(OFFSET_COMMIT_DEADLINE_S)
        try:
            async with deadline:
                return await consumer.faust_commit_offsets(offsets, start_new_transaction)
        except TimeoutError:
            if not deadline.expired():
                raise  # the commit's own (a request's), not the deadline: Faust's handling, as before
            exit_for_restart(FAILED_EXIT_CODE, "an offset commit did not finish within %g s: exiting, so that the "
                             "supervisor restarts this worker (it decides again from the last committed offsets)",
                             OFFSET_COMMIT_DEADLINE_S)
            raise  # exit_for_restart does not return; a test's stand-in may

    async def exactly_once(self, consumer: CommittingConsumer,
                           start_new_transaction: bool) -> tuple[dict[TP, int], bool]:
        """Steps 1-7 (the module's docstring); the offsets committed, and whether they were."""
        state, stage = self.state, self.state.stage
        assert stage is not None  # run() takes this path only with a stage
        # 1. in the same step: the offsets and the group membership they belong to (app/seams/aiokafka.py)
        offsets = {tp: offset for tp, offset in state.decided.items() if consumer.should_commit(tp, offset)}
        state.commit_membership = membership = consumer.membership()
        try:
            # 2. Faust skipped the revocation (it was stopping, or its handler failed): the decided
            # offsets are of an assignment of another generation than the one they would carry
            if offsets and membership.generation != state.assigned_generation:
                raise FencedMemberError(f"offsets decided in generation {state.assigned_generation} of the group, "
                                        f"which is at {membership.generation} now")
            async with asyncio.timeout(COMMIT_DEADLINE_S):  # TimeoutError: past any transaction's life
                # 3. sends the held writes before it first waits, and holds new ones
                revoked = await stage.flush()
                offsets = {tp: offset for tp, offset in offsets.items() if tp.partition not in revoked}
                # 4. one transaction for every partition: it must not commit the writes of a partition
                # whose offset it leaves out (Faust drops the offsets of partitions not assigned)
                if self.one_transaction:
                    assigned_now = {tp.partition for tp in offsets if tp in consumer.assignment()}
                    if not stage.written <= assigned_now:
                        raise FencedMemberError(
                            f"the open transaction holds writes of partitions "
                            f"{sorted(stage.written - assigned_now)} whose offsets this commit would not carry")
                # 5. the offsets and the transactions
                did_commit = bool(offsets) and await consumer.faust_commit_offsets(offsets, start_new_transaction)
        except TimeoutError:
            exit_for_restart(FAILED_EXIT_CODE, "an exactly-once commit failed: it did not finish within %g s (its "
                             "transaction has been aborted by now): exiting without committing again, so that the "
                             "supervisor restarts this worker", COMMIT_DEADLINE_S)
            raise  # exit_for_restart does not return; a test's stand-in may
        except Exception:
            exit_for_restart(FAILED_EXIT_CODE, "an exactly-once commit failed: exiting without committing "
                             "again, so that the supervisor restarts this worker (the open transactions are "
                             "aborted, their records decided again)", exc_info=True)
            raise  # exit_for_restart does not return; a test's stand-in may
        # 6. the store takes what committed
        if did_commit:
            assigned = consumer.assignment()
            stage.committed({tp.partition for tp in offsets if tp in assigned})
        # 7. the held writes go into the new transactions (none after the last commit of a stop)
        stage.commit_ended(transactions_open=start_new_transaction)
        return offsets, did_commit

    def next_wait(self, interval: float) -> float:
        """Right after a commit: the wait before the next one, by how many records it covered."""
        covered, self.covered = self.covered, 0
        wait = next_commit_wait(covered, interval, self.state.busy_commit_interval)
        self.state.metrics.commit_wait.set(wait)
        return wait
