"""paymos rules end to end (issue #19): HTTP → Kafka → worker → PostgreSQL → merchant stub, for the
catalogue's rows no other test drives through the pipeline: ``invoice.underpaid`` (after
``underpaid_waiting``), ``invoice.cancelled``, ``withdrawal.created``, ``withdrawal.processing`` and
``withdrawal.failed``, and ties on ``data.updated_at``.

Every expected value comes from gateway-docs/paymos-events.ru.txt and DESIGN.md (§1 effect types,
§2.3 the summary), never from the implementation's output:
- the read-model row is the winning event's ``data`` itself: ``status`` and ``is_final`` as sent
  ("read data.status and data.is_final from the payload"), amounts kept as the same decimal strings;
- a terminal row (Да in the document's table) gets its one effect of DESIGN §1 (``invoice_underpaid``,
  ``invoice_cancelled``, ``payout_failed``); a non-terminal one (``underpaid_waiting``, ``created``,
  ``processing``) has none in §1, so it gets none;
- the processing rules: a redelivery of the same event_id stays a duplicate, not a new transition;
  event_id identifies one delivery, not one payment, so the same snapshot under another event id is
  not newer and no transition either; do not rely on delivery order: arrival order changes nothing;
- ties on ``data.updated_at`` are broken by the state-machine rank (DESIGN §2.3): awaiting_payment <
  confirming < underpaid_waiting < the terminal statuses; created < processing < the terminal ones.

Effects are counted where the merchant receives them: ``Running.stub.deliveries`` per dedupe key.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.paymos_events import event as paymos_event
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings, read_topic
from topics.catalog import names

BASE_MS = 1_764_412_395_000  # 2025-11-29 10:33:15 UTC, in the unix ms the gateway sends
TABLE = {"inv": "paymos_invoices", "wdr": "paymos_withdrawals"}


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"pr{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path_factory.mktemp("paymos-rules")) as running:
        yield running


def rid(prefix: str) -> str:
    """A resource id of its own for every test (and every parameter), so no test sees another's."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def ev(event_type: str, resource: str, status: str, at: int, **extra: Any) -> bytes:
    """A paymos event whose data.updated_at is ``at`` ms after BASE_MS (is_final: the document's
    "Терминальное" column, see tests/paymos_events.FINAL)."""
    return paymos_event(event_type, resource, status, BASE_MS + at, **extra)


def data_of(body: bytes) -> Any:
    return orjson.loads(body)["data"]


async def outcomes(pipe: Running, resource: str, deliveries: int) -> list[str]:
    """The outcome of each delivery of ``resource``, in the order they were posted, once all
    ``deliveries`` are decided and projected."""
    async def check(c: Any) -> list[str] | None:
        rows = await c.fetch("SELECT outcome FROM webhook_events WHERE resource_id = $1 "
                             "ORDER BY received_at, delivery_id", resource)
        return [r["outcome"] for r in rows] if len(rows) >= deliveries else None
    found: list[str] = await pipe.wait_for(check)
    return found


async def row(pipe: Running, resource: str, status: str) -> dict[str, Any]:
    """The resource's read-model row once it shows ``status``: status, is_final, updated_at_ms and
    the snapshot as stored (jsonb, decoded)."""
    table = TABLE[resource.split("_")[0]]
    found = await pipe.wait_for(lambda c: c.fetchrow(
        f"SELECT status, is_final, updated_at_ms, snapshot::text AS snapshot FROM {table} "
        "WHERE id = $1 AND status = $2", resource, status))
    return {**dict(found), "snapshot": orjson.loads(found["snapshot"])}


async def until(what: str, ready: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not reached in {timeout} s: {what}"
        await asyncio.sleep(0.1)


async def delivered(pipe: Running, resource: str) -> dict[str, int]:
    """Every effect the worker emitted for ``resource`` (orderly.effects, committed), by type, once
    the merchant stub has received each: {type: deliveries of its dedupe key at the stub}.

    Called after every delivery of the resource is decided (``outcomes``): the worker writes a
    decision and its effects in one transaction, so the topic holds all the effects there will be."""
    records = await read_topic(pipe.settings.kafka_bootstrap, names(pipe.settings.namespace).effects)
    emitted = {}
    for r in records:
        effect = orjson.loads(r.value)
        if effect["resource_id"] == resource:
            emitted[effect["dedupe_key"]] = effect["type"]
    stub = pipe.stub.deliveries
    await until(f"the stub received {sorted(emitted)}", lambda: all(stub[k] for k in emitted))
    # counted once the effects worker marked every one delivered: a repeat would have gone out by then
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = $2 FROM effects WHERE resource_id = $1 AND "
                                             "delivered_at IS NOT NULL", resource, len(emitted)))
    # none reached the merchant outside what the worker emitted for it
    assert [k for k in stub if resource in k and k not in emitted] == []
    by_type: dict[str, int] = {}
    for key, kind in emitted.items():
        assert kind not in by_type, f"two dedupe keys for one {kind}: {sorted(emitted)}"
        by_type[kind] = stub[key]
    return by_type


async def effect_payloads(pipe: Running, resource: str) -> dict[str, Any]:
    conn = await pipe.connect()
    try:
        return {r["type"]: orjson.loads(r["payload"]) for r in await conn.fetch(
            "SELECT type, payload::text AS payload FROM effects WHERE resource_id = $1", resource)}
    finally:
        await conn.close()


# --- invoice.underpaid_waiting → invoice.underpaid ------------------------------------------------


async def test_underpaid_waiting_then_underpaid_then_redeliveries(pipe: Running) -> None:
    inv = rid("inv")
    waiting = ev("invoice.underpaid_waiting", inv, "underpaid_waiting", 1000,
                 amount="1.00000000", received_amount="0.40000000", currency="BTC")
    underpaid = ev("invoice.underpaid", inv, "underpaid", 2000,
                   amount="1.00000000", received_amount="0.40000000", currency="BTC")
    await pipe.post("paymos", waiting)
    assert await outcomes(pipe, inv, 1) == ["applied"]
    # not terminal: may still take the rest of the payment, and no effect of §1 is due
    first = await row(pipe, inv, "underpaid_waiting")
    assert (first["is_final"], first["updated_at_ms"], first["snapshot"]) == (False, BASE_MS + 1000, data_of(waiting))
    assert await delivered(pipe, inv) == {}

    same_snapshot_other_id = ev("invoice.underpaid", inv, "underpaid", 2000, event_id=f"evt_{inv}_other_endpoint",
                                amount="1.00000000", received_amount="0.40000000", currency="BTC")
    await pipe.post("paymos", underpaid, underpaid, same_snapshot_other_id)
    assert await outcomes(pipe, inv, 4) == ["applied", "applied", "duplicate", "stale"]
    final = await row(pipe, inv, "underpaid")
    assert (final["is_final"], final["updated_at_ms"], final["snapshot"]) == (True, BASE_MS + 2000, data_of(underpaid))
    assert (final["snapshot"]["amount"], final["snapshot"]["received_amount"]) == ("1.00000000", "0.40000000")
    assert await delivered(pipe, inv) == {"invoice_underpaid": 1}
    payload = (await effect_payloads(pipe, inv))["invoice_underpaid"]
    assert (payload["amount"], payload["received_amount"]) == ("1.00000000", "0.40000000")  # strings, not floats


async def test_underpaid_before_underpaid_waiting(pipe: Running) -> None:
    inv = rid("inv")
    waiting = ev("invoice.underpaid_waiting", inv, "underpaid_waiting", 1000, amount="2.5", received_amount="1.25")
    underpaid = ev("invoice.underpaid", inv, "underpaid", 2000, amount="2.5", received_amount="1.25")
    await pipe.post("paymos", underpaid, waiting, underpaid)
    assert await outcomes(pipe, inv, 3) == ["applied", "stale", "duplicate"]
    final = await row(pipe, inv, "underpaid")
    assert (final["is_final"], final["updated_at_ms"], final["snapshot"]) == (True, BASE_MS + 2000, data_of(underpaid))
    assert await delivered(pipe, inv) == {"invoice_underpaid": 1}


# --- invoice.cancelled ---------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["in_order", "reversed"])
async def test_cancelled_invoice(pipe: Running, order: str) -> None:
    inv = rid("inv")
    confirming = ev("invoice.confirming", inv, "confirming", 1000, amount="0.75")
    cancelled = ev("invoice.cancelled", inv, "cancelled", 2000, amount="0.75")
    arrivals = [confirming, cancelled] if order == "in_order" else [cancelled, confirming]
    await pipe.post("paymos", *arrivals, cancelled)
    expected = ["applied", "applied", "duplicate"] if order == "in_order" else ["applied", "stale", "duplicate"]
    assert await outcomes(pipe, inv, 3) == expected
    final = await row(pipe, inv, "cancelled")
    assert (final["is_final"], final["updated_at_ms"], final["snapshot"]) == (True, BASE_MS + 2000, data_of(cancelled))
    assert await delivered(pipe, inv) == {"invoice_cancelled": 1}


async def test_cancelled_is_final_a_newer_paid_is_no_transition(pipe: Running) -> None:
    """The terminal event ends the state machine: a newer, non-reorg snapshot does not reopen it,
    and the invoice is never credited."""
    inv = rid("inv")
    cancelled = ev("invoice.cancelled", inv, "cancelled", 1000, amount="0.75")
    await pipe.post("paymos", cancelled, ev("invoice.paid", inv, "paid", 2000, amount="0.75"))
    # DESIGN §2.3: out of a terminal state only a reorg moves; anything else waits for one (parked)
    assert await outcomes(pipe, inv, 2) == ["applied", "parked"]
    final = await row(pipe, inv, "cancelled")
    assert (final["is_final"], final["updated_at_ms"], final["snapshot"]) == (True, BASE_MS + 1000, data_of(cancelled))
    assert await delivered(pipe, inv) == {"invoice_cancelled": 1}


# --- withdrawal.created → withdrawal.processing → withdrawal.failed ------------------------------


async def test_withdrawal_created_processing_failed_step_by_step(pipe: Running) -> None:
    wdr = rid("wdr")
    created = ev("withdrawal.created", wdr, "created", 1000, amount="0.10000000", currency="ETH")
    processing = ev("withdrawal.processing", wdr, "processing", 2000, amount="0.10000000", currency="ETH",
                    tx_hash="0x" + "ab" * 32)
    failed = ev("withdrawal.failed", wdr, "failed", 3000, amount="0.10000000", currency="ETH",
                network_fee="0.00050000")
    await pipe.post("paymos", created)
    assert await outcomes(pipe, wdr, 1) == ["applied"]
    step = await row(pipe, wdr, "created")
    assert (step["is_final"], step["updated_at_ms"], step["snapshot"]) == (False, BASE_MS + 1000, data_of(created))
    assert await delivered(pipe, wdr) == {}

    await pipe.post("paymos", processing)
    assert await outcomes(pipe, wdr, 2) == ["applied", "applied"]
    step = await row(pipe, wdr, "processing")
    assert (step["is_final"], step["updated_at_ms"], step["snapshot"]) == (False, BASE_MS + 2000, data_of(processing))
    assert step["snapshot"]["tx_hash"] == "0x" + "ab" * 32  # "доступен её хеш"
    assert await delivered(pipe, wdr) == {}

    await pipe.post("paymos", failed, failed)
    assert await outcomes(pipe, wdr, 4) == ["applied", "applied", "applied", "duplicate"]
    final = await row(pipe, wdr, "failed")
    assert (final["is_final"], final["updated_at_ms"], final["snapshot"]) == (True, BASE_MS + 3000, data_of(failed))
    assert (final["snapshot"]["amount"], final["snapshot"]["network_fee"]) == ("0.10000000", "0.00050000")
    assert await delivered(pipe, wdr) == {"payout_failed": 1}
    payload = (await effect_payloads(pipe, wdr))["payout_failed"]
    assert (payload["amount"], payload["network_fee"]) == ("0.10000000", "0.00050000")


async def test_withdrawal_failed_first_then_older_snapshots_and_redelivery(pipe: Running) -> None:
    wdr = rid("wdr")
    created = ev("withdrawal.created", wdr, "created", 1000, amount="3")
    processing = ev("withdrawal.processing", wdr, "processing", 2000, amount="3", tx_hash="0xfeed")
    failed = ev("withdrawal.failed", wdr, "failed", 3000, amount="3")
    await pipe.post("paymos", failed, processing, created, failed)
    assert await outcomes(pipe, wdr, 4) == ["applied", "stale", "stale", "duplicate"]
    final = await row(pipe, wdr, "failed")
    assert (final["is_final"], final["updated_at_ms"], final["snapshot"]) == (True, BASE_MS + 3000, data_of(failed))
    assert await delivered(pipe, wdr) == {"payout_failed": 1}


async def test_withdrawal_processing_before_created(pipe: Running) -> None:
    wdr = rid("wdr")
    created = ev("withdrawal.created", wdr, "created", 1000, amount="3")
    processing = ev("withdrawal.processing", wdr, "processing", 2000, amount="3", tx_hash="0xfeed")
    await pipe.post("paymos", processing, created, processing)
    assert await outcomes(pipe, wdr, 3) == ["applied", "stale", "duplicate"]
    final = await row(pipe, wdr, "processing")
    assert (final["is_final"], final["updated_at_ms"]) == (False, BASE_MS + 2000)
    assert final["snapshot"] == data_of(processing)
    assert await delivered(pipe, wdr) == {}


# --- ties on data.updated_at: the state-machine rank decides -------------------------------------

TIES = [  # (lower rank, higher rank, the higher one's effect per DESIGN §1, or None)
    (("invoice.confirming", "confirming"), ("invoice.paid", "paid"), "invoice_paid"),
    (("invoice.underpaid_waiting", "underpaid_waiting"), ("invoice.underpaid", "underpaid"), "invoice_underpaid"),
    (("withdrawal.created", "created"), ("withdrawal.processing", "processing"), None),
    (("withdrawal.processing", "processing"), ("withdrawal.failed", "failed"), "payout_failed"),
]


@pytest.mark.parametrize("first", ["lower_first", "higher_first"])
@pytest.mark.parametrize(("lower", "higher", "effect"), TIES, ids=[f"{lo[1]}-{hi[1]}" for lo, hi, _ in TIES])
async def test_equal_updated_at_the_rank_decides(pipe: Running, lower: tuple[str, str], higher: tuple[str, str],
                                                 effect: str | None, first: str) -> None:
    resource = rid("inv" if lower[0].startswith("invoice") else "wdr")
    low = ev(lower[0], resource, lower[1], 5000, amount="1.5")
    high = ev(higher[0], resource, higher[1], 5000, amount="1.5")
    await pipe.post("paymos", *([low, high] if first == "lower_first" else [high, low]))
    # the lower rank after the higher is not newer state: nothing changes
    expected = ["applied", "applied"] if first == "lower_first" else ["applied", "stale"]
    assert await outcomes(pipe, resource, 2) == expected
    final = await row(pipe, resource, higher[1])
    assert (final["updated_at_ms"], final["snapshot"]) == (BASE_MS + 5000, data_of(high))
    assert await delivered(pipe, resource) == ({effect: 1} if effect else {})
