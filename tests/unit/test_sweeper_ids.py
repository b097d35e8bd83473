"""The sweeper looks a raw record's decision up by the id the worker decided it under: the same for a
delivery id that is missing, null, empty or not UTF-8 (a sweeper that could not read it raised, and
the fetcher running it restarted on that record for ever; one that read "" for a missing id never
found its decision and appended the record again every sweep)."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest

from app.core.dispatch import Incoming, plan_batch
from app.gateways.registry import GATEWAYS
from app.sweeper import delivery_id_of
from topics.catalog import names
from topics.records import CHECKED, raw_headers

N = names("t")
BODY = orjson.dumps({"id": "e1", "type": "payment.captured", "payment_ref": "pay_s", "sequence": None,
                     "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": 5, "currency": "EUR"})


@pytest.mark.parametrize("delivery_id", ["missing", None, b"", b"\xff\xfe", b"d_1"])
def test_the_sweeper_names_a_record_as_the_worker_decided_it(delivery_id: bytes | str | None) -> None:
    headers = [(k, v) for k, v in raw_headers("card", "x", 1_733_000_000_000) if k != "delivery_id"]
    if delivery_id != "missing":
        headers.append(("delivery_id", delivery_id))  # type: ignore[arg-type]
    headers.append(CHECKED)
    plan = plan_batch(N, GATEWAYS, [Incoming(b"card:pay_s", BODY, headers, 17, 3, N.raw)], lambda p, k: None)
    (decision,) = [orjson.loads(r[2]) for r in plan.records[3] if r[0] == N.decisions]
    message = SimpleNamespace(topic=N.raw, partition=3, offset=17, headers=headers)
    assert delivery_id_of(message) == decision["delivery_id"]
