"""Start-up work every process shares: topics exist with their settings, migrations are applied."""

from __future__ import annotations

import logging

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, KafkaError

from app.kafka_client import client_options, refusal
from app.producer import KeyedProducer
from app.settings import Settings
from projections.migrate import migrate
from topics.admin import ensure_topics, replace_topic_config, topic_configs
from topics.catalog import TopicSpec, catalog, names
from topics.records import CORRELATION, H_RECORD

log = logging.getLogger("orderly.bootstrap")


async def prepare(settings: Settings, topics: bool = True) -> tuple[list[str], list[str]]:
    """Idempotent; returns (topics created, migrations applied). ``topics=False``: PostgreSQL only,
    for a process that must start while Kafka is away (the admin)."""
    created = await _ensure_topics(settings) if topics else []
    conn = await asyncpg.connect(settings.postgres_dsn.reveal())
    try:
        applied = await migrate(conn, settings.namespace)
    finally:
        await conn.close()
    return created, applied


async def _ensure_topics(settings: Settings) -> list[str]:
    specs = catalog(settings.namespace, settings.partitions, settings.replication_factor, settings.min_insync,
                    settings.raw_retention_ms)
    try:
        created = await ensure_topics(settings.kafka_bootstrap, specs, **client_options(settings))
    except KafkaConnectionError:
        # aiokafka says only "Unable to bootstrap"; a broker that refuses the TLS handshake or the
        # SASL authentication is a configuration error, said with its reason (KafkaRefusedError)
        if (refused := await refusal(settings)) is not None:
            raise refused from None
        raise
    raw = next(s for s in specs if s.name == names(settings.namespace).raw)
    if raw.name not in created:
        try:
            await _keep_raw_retention(settings, raw)
        except (KafkaError, RuntimeError) as exc:
            if settings.raw_retention_ms is not None:
                raise  # asked for a retention and not given it: say so, do not run with the old one
            # unset: the topic keeps what it has; a principal without DescribeConfigs/AlterConfigs still starts
            log.warning("%s: could not check its retention (%s); ORDERLY_RAW_RETENTION_MS is unset, so it "
                        "is left as it is", raw.name, exc)
    return created


async def _keep_raw_retention(settings: Settings, raw: TopicSpec) -> None:
    """An existing orderly.raw gets ORDERLY_RAW_RETENTION_MS (or for ever again, unset) when its
    retention differs: the setting is where the retention is decided (the catalog's whole
    configuration of the topic is sent: topics/admin.py)."""
    wanted = raw.config["retention.ms"]
    found = (await topic_configs(settings.kafka_bootstrap, [raw.name], **client_options(settings)))[raw.name]
    if found.get("retention.ms") == wanted:
        return
    await replace_topic_config(settings.kafka_bootstrap, raw, **client_options(settings))
    log.warning("%s: retention.ms %s -> %s (ORDERLY_RAW_RETENTION_MS)", raw.name, found.get("retention.ms"), wanted)


async def migrate_correlations(settings: Settings) -> int:
    """Move what an installation from before 0.2 holds in ``{namespace}.correlations`` into
    ``{namespace}.raw`` (same key, headers, and ``record: correlation``), then delete that topic;
    returns the number of records moved (0 when there is no such topic).

    Idempotent and safe to repeat after a crash: a correlation appended twice is decided as a
    duplicate of itself. The worker already decided these records from the old topic, so live
    state does not change; a replay finds them in the one log, after the webhooks that came before
    the upgrade, and releases those in log order exactly as if the correlation had come first
    (app/core/pg.py)."""
    topic = names(settings.namespace).correlations
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=15_000,
                                **client_options(settings))
    await admin.start()
    try:
        if topic not in await admin.list_topics():
            return 0
        consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                                    **client_options(settings))
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in (consumer.partitions_for_topic(topic) or ())]
            if not tps:
                await consumer.topics()  # metadata for the topic
                tps = [TopicPartition(topic, p) for p in (consumer.partitions_for_topic(topic) or ())]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            records = []
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                for tp, messages in (await consumer.getmany(timeout_ms=500, max_records=5000)).items():
                    records += [(names(settings.namespace).raw, m.key, m.value,
                                 [*((k, v) for k, v in m.headers if k != H_RECORD), (H_RECORD, CORRELATION.encode())])
                                for m in messages if m.offset < ends[tp]]
        finally:
            await consumer.stop()
        if records:
            producer = KeyedProducer(settings.kafka_bootstrap, **client_options(settings))
            await producer.start()
            try:
                await producer.send_all(records)
            finally:
                await producer.stop()
        await admin.delete_topics([topic])
        log.warning("moved %d correlations from %s into %s and deleted %s", len(records), topic,
                    names(settings.namespace).raw, topic)
        return len(records)
    finally:
        await admin.close()
