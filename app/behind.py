"""The processes behind the answer (worker, projector, effects worker, fetcher) yield the CPU to the
ingest (process layer).

A gateway's request waits for its answer; what these do with it can wait for the CPU. On a machine
they share with the ingest (`orderly dev`, `orderly run`, one host), they run at
ORDERLY_PIPELINE_NICE, so the ingest's answers come first and they take the CPU it leaves: under a
burst the gateways keep getting their answers while the read models catch up from Kafka. Each
container of the Helm chart has its own CPU share, which the niceness does not change.
"""

from __future__ import annotations

import logging

from app.process_setup import lower_priority
from app.settings import Settings

log = logging.getLogger("orderly.process")


def yield_cpu(settings: Settings) -> None:
    """This process at ORDERLY_PIPELINE_NICE, unless it was started nicer."""
    log.info("running at niceness %d (ORDERLY_PIPELINE_NICE=%d)", lower_priority(settings.pipeline_nice),
             settings.pipeline_nice)
