"""The embedded Kafka and PostgreSQL every benchmark runs against, in a fresh temp folder."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer


@contextmanager
def embedded(prefix: str, heap_mb: int = 512) -> Iterator[tuple[Path, KafkaBroker, PostgresServer]]:
    work = Path(tempfile.mkdtemp(prefix=prefix))
    kafka = KafkaBroker(work / "kafka", heap_mb=heap_mb)
    postgres = PostgresServer(work / "postgres")
    kafka.start()
    postgres.start()
    try:
        yield work, kafka, postgres
    finally:
        kafka.stop()
        postgres.stop()
