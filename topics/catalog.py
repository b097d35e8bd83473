"""Every Orderly topic with its settings (DESIGN.md §4), derived from a namespace.

The live namespace is ``orderly``; a replay builds into another (``orderly replay --into NS``),
so every name is ``f"{namespace}.{suffix}"``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

FOREVER = "-1"
DAY_MS = 24 * 3600 * 1000
MAX_RECORD_BYTES = 2 * 1024 * 1024  # orderly.raw and orderly.quarantine: a 1 MiB body with its headers
# What a worker derives from one raw record (a decision with the parsed body, a resource's state
# with its parked events, the changelog) fits in this; the worker sets aside a record whose outputs
# would pass half of it (app/core/dispatch.py), so no output is ever refused for its size.
DERIVED_RECORD_BYTES = 16 * 1024 * 1024
# What producers may send and consumers must be able to fetch from one partition: any record above.
REQUEST_BYTES = DERIVED_RECORD_BYTES + 1024 * 1024


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict)
    # Keyed by gateway:resource_id and joined on by agents: must share the raw topic's partitioning.
    co_partitioned: bool = True


@dataclass(frozen=True)
class TopicNames:
    raw: str
    correlations: str  # before 0.2 correlations had a topic of their own; now only migrated from it
    quarantine: str
    state: str
    decisions: str
    facts: str
    effects: str
    fetch: str
    changelog: str  # the worker table's changelog (Faust's name: "{app id}-{table}-changelog")
    workers: str  # each worker's alive records (app/worker/peers.py)


@functools.lru_cache(maxsize=64)  # called per request by the ingest
def names(namespace: str = "orderly") -> TopicNames:
    raw, correlations, quarantine, state, decisions, facts, effects, fetch = (f"{namespace}.{s}" for s in (
        "raw", "correlations", "quarantine", "state", "decisions", "facts", "effects", "fetch"))
    return TopicNames(raw, correlations, quarantine, state, decisions, facts, effects, fetch,
                      changelog=f"{namespace}-worker-resources-changelog", workers=f"{namespace}.workers")


def catalog(namespace: str = "orderly", partitions: int = 12, replication_factor: int = 1,
            min_insync_replicas: int | None = None, raw_retention_ms: int | None = None) -> list[TopicSpec]:
    """``raw_retention_ms``: how long orderly.raw keeps a record (ORDERLY_RAW_RETENTION_MS; None: for ever)."""
    n = names(namespace)
    keep = {"cleanup.policy": "delete", "retention.ms": FOREVER, "retention.bytes": FOREVER}
    # The ingest accepts bodies up to 1 MiB; with headers and batch overhead a record is larger.
    big = {"max.message.bytes": str(MAX_RECORD_BYTES)}
    derived = {"max.message.bytes": str(DERIVED_RECORD_BYTES)}
    # min.insync.replicas cannot exceed the replicas there are; with 3+ replicas, 2 must ack.
    if min_insync_replicas is None:
        min_insync_replicas = 2 if replication_factor >= 3 else 1
    if min_insync_replicas > replication_factor:
        raise ValueError(f"min.insync.replicas {min_insync_replicas} exceeds the replication factor "
                         f"{replication_factor}: no write could ever be acknowledged")
    durable = {"min.insync.replicas": str(min_insync_replicas)}

    def spec(name: str, config: dict[str, str], co_partitioned: bool = True) -> TopicSpec:
        return TopicSpec(name, partitions, replication_factor, {**durable, **config}, co_partitioned)

    return [
        # The source of truth: every webhook as received, kept forever so replay can rebuild, unless
        # the operator bounds it for personal data (then replay rebuilds from what is left)
        spec(n.raw, {**keep, **big, **({"retention.ms": str(raw_retention_ms)} if raw_retention_ms else {})}),
        # raw bodies, and whatever record a sink sets aside (a decision can be as large as its topic takes)
        spec(n.quarantine, {**keep, **derived}, co_partitioned=False),
        spec(n.state, {"cleanup.policy": "compact", "min.compaction.lag.ms": str(60_000), **derived}),
        spec(n.decisions, {"cleanup.policy": "delete", "retention.ms": str(90 * DAY_MS), **derived}),
        # facts and effects are keyed by their own ids but written to their resource's partition
        spec(n.facts, {**keep, **derived}),
        spec(n.effects, {"cleanup.policy": "delete", "retention.ms": str(90 * DAY_MS), **derived}),
        spec(n.fetch, {"cleanup.policy": "delete", "retention.ms": str(14 * DAY_MS)}),
        # created here rather than by Faust, so that a resource's state with its parked events fits
        spec(n.changelog, {"cleanup.policy": "compact", **derived}),
        # the workers' alive records, read in one order and timed by the broker (app/worker/peers.py)
        TopicSpec(n.workers, 1, replication_factor, {**durable, "cleanup.policy": "delete",
                                                     "retention.ms": str(3600 * 1000), "segment.ms": str(600 * 1000),
                                                     "message.timestamp.type": "LogAppendTime"},
                  co_partitioned=False),
    ]
