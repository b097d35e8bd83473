"""The door to mode-streaming 0.7.1's internals: Faust's flow control and its worker's stop (seam layer).

Paths and line numbers are of mode 0.7.1 (app/seams/__init__.py pins it; tests/unit/test_seams_mode.py
checks that what is relied on is still there).
"""

from __future__ import annotations

import asyncio
import logging

import faust
from mode.utils.queues import FlowControlEvent


class FlowControl(FlowControlEvent):
    """Faust's flow control, clearing the stream queues only when the flow comes back from a suspension.

    Faust resumes the flow twice per rebalance: at the start of recovery (the changelogs are read
    through the same queues), and again once the stream partitions are resumed and sought to their
    committed offsets. The second resume cleared the queues too, although the flow had not stopped
    since the first: records the fetcher had handed over in between, of the new generation, were
    dropped while its read offsets had moved past them, and the worker's skip guard restarted the
    worker (exit 5). Records of a revoked partition are cleared when the flow is suspended at the
    revocation (and by this resume after it), and a stream skips an event of another generation.
    """

    def resume(self) -> None:
        # mode/utils/queues.py FlowControlEvent.resume (line 97) without its unconditional clear():
        # _suspend and _resume are its two Events (line 82), is_active() reads _suspend
        suspended = not self.is_active()
        self._suspend.clear()
        self._resume.set()
        if suspended:
            self.clear()


class QuietWorker(faust.Worker):
    """Faust's worker sets the root logger to DEBUG so that every log record turns its terminal
    spinner; then every debug call in Faust and mode builds a LogRecord, a noticeable share of the
    worker's CPU. No spinner: the root logger keeps the configured level."""

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        # mode/worker.py Worker._setup_logging calls this hook (line 190); faust/worker.py
        # Worker.on_setup_root_logger (line 373) is the one that sets DEBUG for its spinner
        # (Worker.spinner, faust/worker.py line 205, which its start and stop test for None)
        self.spinner = None
        logger.setLevel(level or logging.WARNING)

    async def _sentinel_task(self) -> None:
        """mode runs this last, after its services stopped and their tasks were gathered, before it
        closes the loop; its own sleeps a second, which every stop (and so every restart) waited.
        mode/worker.py Worker._sentinel_task (line 317), run by Worker._shutdown_loop."""
        await asyncio.sleep(0)
