"""`orderly simulate --check --target`: the seeded histories the core check runs, through the real
stack — signed over HTTP to the ingest, fetched answers appended as the fetcher does, Kafka, the
worker, the projector, the effects worker — and compared with the same oracle in PostgreSQL's read
models and in what the merchant's endpoint was delivered (each expected key exactly once)."""

from __future__ import annotations

import io
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from app.simulator import check, stack, truths
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings

PER_GATEWAY = 500


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    settings = make_settings(kafka.bootstrap, postgres.dsn, f"simcheck{uuid.uuid4().hex[:8]}")
    with running_pipeline(settings, tmp_path_factory.mktemp("simulate-check")) as running:
        yield running


def test_five_hundred_histories_per_gateway_through_the_stack_match_the_oracle(pipe: Running) -> None:
    out = io.StringIO()
    total, bad = stack.run(pipe.settings, pipe.ingest.url, ["card", "paymos", "pg"], PER_GATEWAY, 1, "e2e", out,
                           delivered=lambda: Counter(pipe.stub.deliveries), timeout_s=90.0)
    assert out.getvalue().splitlines()[-1] == f"check: histories={3 * PER_GATEWAY} mismatches=0", out.getvalue()[-4000:]
    assert (total, bad) == (3 * PER_GATEWAY, 0)
    # what was compared is what the documents fix: every expected effect reached the merchant once
    keys = {e[0] for g in ("card", "paymos", "pg") for i in range(PER_GATEWAY)
            for e in check.expected(truths.make(g, 1 + i, "e2e")).effects}
    assert {k: n for k, n in pipe.stub.deliveries.items() if k in keys} == dict.fromkeys(keys, 1)
