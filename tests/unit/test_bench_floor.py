"""bench/floor.py's ingest does the steps it claims: a request split at its Content-Length (however its
bytes arrive), the pg signature checked, the body appended under its resource's key."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.simulator.deliver import signed_headers
from bench.floor import Appends, Ingest, deposit_args
from tests.pg_events import deposit
from topics.partitioning import partition_for

SECRET = "whsec_floor_test"


class Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes, int, dict[str, bytes]]] = []

    async def send(self, topic: str, value: bytes, key: bytes, headers: list[tuple[str, bytes]],
                   partition: int) -> asyncio.Future[None]:
        self.sent.append((topic, key, value, partition, dict(headers)))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def request(body: bytes, headers: dict[str, str]) -> bytes:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"POST /webhooks/pg HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


class Broken(Producer):
    async def send(self, topic: str, value: bytes, key: bytes, headers: list[tuple[str, bytes]],
                   partition: int) -> asyncio.Future[None]:
        raise ConnectionError("no broker")


async def feed(data: bytes, cuts: list[int], producer: Producer | None = None) -> tuple[Producer, Transport]:
    producer, transport = producer or Producer(), Transport()
    protocol = Ingest(SECRET.encode(), Appends(producer, "ns.raw", 12))
    protocol.connection_made(transport)
    start = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        protocol.data_received(data[start:cut])
        start = cut
    for _ in range(10):  # the answers' tasks
        await asyncio.sleep(0)
    return producer, transport


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2000), max_size=6))
def test_signed_requests_are_appended_under_their_resource_key_however_they_arrive(cuts: list[int]) -> None:
    bodies = [deposit(f"dep_{i}", 1, "pending") for i in range(3)]
    data = b"".join(request(body, signed_headers("pg", body, SECRET)) for body in bodies)
    producer, transport = asyncio.run(feed(data, [min(c, len(data)) for c in cuts]))
    keys = [b"pg:dep_0", b"pg:dep_1", b"pg:dep_2"]
    assert [(s[1], s[2], s[3]) for s in producer.sent] == [
        (key, body, partition_for(key, 12)) for key, body in zip(keys, bodies, strict=True)]
    assert all(s[4]["gateway"] == b"pg" and s[4]["delivery_id"] for s in producer.sent)  # the raw topic's headers
    assert len({s[4]["delivery_id"] for s in producer.sent}) == 3
    assert [w.split(b"\r\n")[0] for w in transport.written] == [b"HTTP/1.1 200 OK"] * 3


@pytest.mark.parametrize("tamper", ["body", "secret"])
def test_a_request_not_signed_with_the_secret_is_refused_and_not_appended(tamper: str) -> None:
    body = deposit("dep_1", 1, "pending")
    headers = signed_headers("pg", body, "another" if tamper == "secret" else SECRET)
    sent = body.replace(b"pending", b"settled") if tamper == "body" else body
    producer, transport = asyncio.run(feed(request(sent, headers), []))
    assert producer.sent == []
    assert transport.written[0].startswith(b"HTTP/1.1 401")


def test_a_deposit_row_has_pg_deposits_columns_in_order() -> None:
    from projections.sql import UPSERT_ROW

    row: dict[str, Any] = {"id": "dep_1", "version": 3, "status": "settled", "is_terminal": None,
                           "late_slip_accepted_until": None, "ordered_amount_minor": 500,
                           "transferred_amount_minor": 500, "amount_received_minor": 500, "fee_total_minor": 10,
                           "credited_amount_minor": 490}
    args = dict(zip(UPSERT_ROW["pg_deposits"].columns, deposit_args(row), strict=True))
    assert (args["pg_deposit_id"], args["pg_version"], args["credited_amount_minor"]) == ("dep_1", 3, 490)
    assert (args["our_order_id"], args["our_user_id"]) == ("o_dep_1", "u_dep_1")


def test_every_request_gets_an_answer_when_kafka_fails_or_the_body_does_not_read() -> None:
    body = deposit("dep_1", 1, "pending")
    _, failed = asyncio.run(feed(request(body, signed_headers("pg", body, SECRET)), [], Broken()))
    assert failed.written == [b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"]
    odd = b'{"data": {"object": {}}}'
    producer, refused = asyncio.run(feed(request(odd, signed_headers("pg", odd, SECRET)), []))
    assert producer.sent == [] and refused.written[0].startswith(b"HTTP/1.1 400")


def test_a_signature_whose_time_is_not_a_number_is_refused() -> None:
    body = deposit("dep_1", 1, "pending")
    headers = {"PG-Signature": "t=soon,v1=" + "0" * 64}
    producer, transport = asyncio.run(feed(request(body, headers), []))
    assert producer.sent == [] and transport.written[0].startswith(b"HTTP/1.1 401")
