"""ORDERLY_RAW_RETENTION_MS reaches orderly.raw on a real broker (issue #48 item 5; DESIGN.md §4):
set when the bootstrap creates the topic, changed on an existing one (its other settings kept), and
for ever again when unset."""

from __future__ import annotations

import uuid

from app.bootstrap import prepare
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.support import make_settings
from topics.admin import topic_configs
from topics.catalog import MAX_RECORD_BYTES, names

DAY_MS = 86_400_000


async def test_the_raw_retention_is_set_changed_and_unset_at_start(kafka: KafkaBroker,
                                                                   postgres: PostgresServer) -> None:
    settings = make_settings(kafka.bootstrap, postgres.dsn, f"ret{uuid.uuid4().hex[:8]}")
    n = names(settings.namespace)

    async def configs() -> dict[str, dict[str, str]]:
        return await topic_configs(kafka.bootstrap, [n.raw, n.quarantine])

    created, _ = await prepare(settings.with_overrides(raw_retention_ms=7 * DAY_MS))
    assert n.raw in created
    found = await configs()
    assert found[n.raw]["retention.ms"] == str(7 * DAY_MS)
    assert found[n.quarantine]["retention.ms"] == "-1"

    created, _ = await prepare(settings.with_overrides(raw_retention_ms=2 * DAY_MS))  # an existing topic
    assert created == []
    found = await configs()
    assert found[n.raw]["retention.ms"] == str(2 * DAY_MS)
    # AlterConfigs replaces the topic's whole configuration: the catalog's other settings are still there
    assert (found[n.raw]["retention.bytes"], found[n.raw]["max.message.bytes"], found[n.raw]["cleanup.policy"]) == (
        "-1", str(MAX_RECORD_BYTES), "delete")

    await prepare(settings)  # unset: for ever again, as DESIGN §4 has it
    assert (await configs())[n.raw]["retention.ms"] == "-1"
