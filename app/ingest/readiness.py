"""/healthz and /readyz: Kafka answering now, within its deadline; PostgreSQL reported beside it (I/O shell)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from aiohttp import web

from app.ingest.answers import Unavailable, json_response
from app.ingest.appender import Appender
from app.ingest.correlation_store import CorrelationStore

log = logging.getLogger("orderly.ingest")

READY_DEADLINE_S = 2.0  # DESIGN.md §3: readiness is Kafka and PostgreSQL answering now, within 2 s


class NoAnswer(Exception):
    """A readiness probe did not complete within its deadline."""


async def answer_within(check: Awaitable[None], deadline_s: float) -> BaseException | None:
    """None if ``check`` completed within ``deadline_s``, else what went wrong. Waits no longer
    than the deadline even for a check that does not honour cancellation promptly."""
    task = asyncio.ensure_future(check)
    done, _ = await asyncio.wait({task}, timeout=deadline_s)
    if not done:
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # nobody awaits it any more
        return NoAnswer(f"no answer within {deadline_s:g} s")
    return task.exception()


def public_reason(exc: BaseException) -> str:
    """What /readyz says on the internet-facing port: our own messages, otherwise only the error's
    type (an exception's text may carry internal addresses; the log has it in full)."""
    cause = exc.__cause__
    if isinstance(exc, (NoAnswer, Unavailable)) and cause is None:
        return str(exc)
    return type(cause or exc).__name__


async def healthz(request: web.Request) -> web.Response:
    return json_response(200, status="ok")


class Readiness:
    """/readyz over the appender's and the correlation store's own connections."""

    def __init__(self, appender: Appender, correlations: CorrelationStore, raw_topic: str) -> None:
        self.appender = appender
        self.correlations = correlations
        self.raw_topic = raw_topic

    async def readyz(self, request: web.Request) -> web.Response:
        """Both asked concurrently, each within READY_DEADLINE_S. Ready when Kafka answers (DESIGN.md
        §3): storing a webhook needs Kafka only, so PostgreSQL away is reported (``postgres``: false,
        with its error) but keeps the ingest ready; correlations answer 503 meanwhile."""
        kafka, postgres = await asyncio.gather(
            answer_within(self.appender.probe(self.raw_topic), READY_DEADLINE_S),
            answer_within(self.correlations.probe(), READY_DEADLINE_S),
        )
        if kafka is None and postgres is None:
            return json_response(200, kafka=True, postgres=True)
        failed = {name: exc for name, exc in (("kafka", kafka), ("postgres", postgres)) if exc is not None}
        for name, exc in failed.items():
            log.warning("%s: %s: %s: %s", "not ready" if name == "kafka" else "ready, but", name,
                        type(exc).__name__, exc)
        return json_response(503 if kafka is not None else 200, kafka=kafka is None, postgres=postgres is None,
                             errors={name: public_reason(exc) for name, exc in failed.items()})
