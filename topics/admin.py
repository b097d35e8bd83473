"""Idempotent topic creation at start-up (I/O at the edge of the topics package)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from topics.catalog import TopicSpec


class TopicMismatchError(RuntimeError):
    """An existing topic has another partition count than configured (co-partitioning would break)."""


async def _partition_counts(admin: AIOKafkaAdminClient, topics: list[str]) -> dict[str, int]:
    # A topic created a moment ago can be described with no partitions until its metadata
    # settles; only a stable, non-empty answer is compared with the configuration.
    counts: dict[str, int] = {}
    for _ in range(100):
        described = await admin.describe_topics(topics)
        counts = {d["topic"]: len(d["partitions"]) for d in described}
        if all(counts.get(t) for t in topics):
            break
        await asyncio.sleep(0.1)
    return counts


async def ensure_topics(bootstrap: str, specs: Iterable[TopicSpec], **client: Any) -> list[str]:
    """Create the missing topics; return the names created. Existing ones are checked, not changed.
    ``client``: aiokafka's options of how to reach the brokers (security_protocol, ssl_context, sasl_*)."""
    specs = list(specs)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000, **client)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            try:
                await admin.create_topics([
                    NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=dict(s.config))
                    for s in missing
                ])
            except TopicAlreadyExistsError:
                pass  # a concurrent start created it; the check below still runs
        counts = await _partition_counts(admin, [s.name for s in specs])
        for s in specs:
            if s.co_partitioned and counts.get(s.name) != s.partitions:
                raise TopicMismatchError(
                    f"topic {s.name} has {counts.get(s.name)} partitions, configured {s.partitions}: "
                    "records of one resource would land on different partitions"
                )
        return [s.name for s in missing]
    finally:
        await admin.close()


async def topic_configs(bootstrap: str, topics: Iterable[str], **client: Any) -> dict[str, dict[str, str]]:
    """The broker's effective configuration of each topic (for start-up checks and tests)."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000, **client)
    await admin.start()
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
    finally:
        await admin.close()
    found: dict[str, dict[str, str]] = {}
    for response in responses:
        for _error, _message, _kind, name, entries in response.resources:
            found[name] = {entry[0]: entry[1] for entry in entries}
    return found


async def replace_topic_config(bootstrap: str, spec: TopicSpec, **client: Any) -> None:
    """Give an existing topic the spec's whole configuration (AlterConfigs replaces a topic's
    configuration as a set, so every key of the spec is sent, not only the one that changed);
    RuntimeError naming Kafka's refusal (e.g. a principal that may not alter topic configs)."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000, **client)
    await admin.start()
    try:
        responses = await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, spec.name,
                                                               configs=dict(spec.config))])
    finally:
        await admin.close()
    errors = [(code, message) for response in responses for code, message, *_ in response.resources if code]
    if errors:
        raise RuntimeError(f"{spec.name}: Kafka refused its configuration {dict(spec.config)}: error "
                           f"{errors[0][0]} {errors[0][1] or ''}".rstrip())


async def broker_configs(bootstrap: str, **client: Any) -> dict[str, str]:
    """One broker's effective configuration (the brokers of a cluster share their group settings;
    app/group_session.py's start-up check)."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000, **client)
    await admin.start()
    try:
        node = (await admin.describe_cluster())["brokers"][0]["node_id"]
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, str(node))])
    finally:
        await admin.close()
    return {entry[0]: entry[1] for response in responses
            for _error, _message, _kind, _name, entries in response.resources for entry in entries}
