"""The ingest against hostile HTTP: ids and fields past DESIGN.md §2.4's limits, bodies that never
arrive, slow headers, and readiness while the broker is stopped or does not answer."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import orjson
import pytest

from app.bootstrap import prepare
from app.settings import Secret, Settings
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from tests.support import ServedIngest, make_settings, read_topic, serve_ingest, serve_ingest_as_run
from topics.catalog import names
from topics.records import Correlation

READ_TIMEOUT_S = 0.5
AUTH = {"Authorization": "Bearer test-token"}
MAPPING = {"merchant_reference": "mr_1", "our_order_id": "ord_1", "our_user_id": "usr_1"}


@pytest.fixture
async def settings(kafka: KafkaBroker, postgres: PostgresServer, namespace: str) -> Settings:
    s = make_settings(kafka.bootstrap, postgres.dsn, namespace, read_timeout_s=READ_TIMEOUT_S)
    await prepare(s)
    return s


@pytest.fixture
def ingest(settings: Settings) -> Iterator[ServedIngest]:
    with serve_ingest_as_run(settings) as served:
        yield served


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def put(http: aiohttp.ClientSession, ingest: ServedIngest, deposit_id: str, body: bytes,
              headers: dict[str, str] | None = None) -> tuple[int, str]:
    url = f"{ingest.url}/correlations/pg/deposits/{quote(deposit_id, safe='')}"
    async with http.put(url, data=body, headers=headers or AUTH) as resp:
        return resp.status, await resp.text()


async def raw_request(url: str, request: bytes, within: float) -> tuple[bytes, float]:
    """Send ``request`` bytes as they are and read until the server closes the connection; the
    answer and the seconds it took. Fails if the socket is still open after ``within`` seconds."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    started = time.monotonic()
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(within):
            answer = await reader.read()  # b"" or the answer, once the server closed
        return answer, time.monotonic() - started
    finally:
        writer.close()


async def test_correlation_ids_and_fields_past_the_limits_get_400_with_the_reason(
        settings: Settings, ingest: ServedIngest, http: aiohttp.ClientSession) -> None:
    cases = [
        ("dep\x00nul", MAPPING, "pg_deposit_id: an id has printable characters only"),
        ("d" * 6000, MAPPING, "pg_deposit_id: an id has 1-200 characters, got 6000"),
        ("d" * 201, MAPPING, "pg_deposit_id: an id has 1-200 characters, got 201"),
        ("dep_1", {**MAPPING, "merchant_reference": "m" * 10_240},
         "merchant_reference: an id has 1-200 characters, got 10240"),
        ("dep_1", {**MAPPING, "our_order_id": "ord\x00"}, "our_order_id: an id has printable characters only"),
        ("dep_1", {**MAPPING, "our_user_id": "line\nbreak"}, "our_user_id: an id has printable characters only"),
        ("dep_1", {**MAPPING, "our_user_id": ""}, "our_user_id: an id has 1-200 characters, got 0"),
        ("dep_1", {**MAPPING, "our_user_id": 7}, "our_user_id: expected a string id, got int"),
        ("dep_1", {"merchant_reference": "mr_1"}, "missing fields: our_order_id, our_user_id"),
        ("dep_1", [MAPPING], "body must be a JSON object"),
        ("dep_1", "a string", "body must be a JSON object"),
    ]
    for deposit_id, body, reason in cases:
        status, answer = await put(http, ingest, deposit_id, orjson.dumps(body))
        assert (status, orjson.loads(answer)["error"]) == (400, reason), deposit_id[:20]
    for raw in (b"not json", b"\xff\xfe", b""):
        status, answer = await put(http, ingest, "dep_1", raw)
        assert (status, orjson.loads(answer)["error"]) == (400, "body must be a JSON object")
    # a NUL spelled in JSON and a lone surrogate are refused too
    status, answer = await put(http, ingest, "dep_1", orjson.dumps(MAPPING).replace(b"mr_1", b"mr\\u0000"))
    assert (status, orjson.loads(answer)["error"]) == (400, "merchant_reference: an id has printable characters only")
    status, _ = await put(http, ingest, "dep_1", orjson.dumps(MAPPING).replace(b"mr_1", b"mr\\ud800"))
    assert status == 400

    # the limits themselves are accepted: 200 characters everywhere
    edge = {f: f[0] * 200 for f in MAPPING}
    assert (await put(http, ingest, "d" * 200, orjson.dumps(edge)))[0] == 200
    [stored] = await read_topic(settings.kafka_bootstrap, names(settings.namespace).raw)
    assert Correlation.from_bytes(stored.value) == Correlation("d" * 200, **edge)


async def test_correlation_bodies_too_large_or_not_utf8_headers(
        settings: Settings, ingest: ServedIngest, http: aiohttp.ClientSession) -> None:
    big = orjson.dumps({**MAPPING, "padding": " " * 65_536})
    status, answer = await put(http, ingest, "dep_1", big)
    assert (status, orjson.loads(answer)["error"]) == (413, "body over 65536 bytes")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the bound applies as it arrives
        yield b'{"padding":"'
        for _ in range(5):
            yield b" " * 16_384

    url = f"{ingest.url}/correlations/pg/deposits/dep_1"
    async with http.put(url, data=chunks(), headers=AUTH) as resp:
        assert (resp.status, (await resp.json())["error"]) == (413, "body over 65536 bytes")

    # A bearer token with bytes that are not UTF-8 is a wrong token, not a 500.
    request = (b"PUT /correlations/pg/deposits/dep_1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               b"Authorization: Bearer \xff\xfe\r\nContent-Length: 2\r\n\r\n{}")
    refused, _ = await raw_request(ingest.url, request, within=5)
    assert refused.startswith(b"HTTP/1.1 401"), refused[:200]
    # A compressed body is refused as on the webhook route: aiohttp decodes no body (issue #45).
    async with http.put(url, data=gzip.compress(orjson.dumps(MAPPING)),
                        headers={**AUTH, "Content-Encoding": "gzip"}) as resp:
        assert resp.status == 415, await resp.text()
    assert await read_topic(settings.kafka_bootstrap, names(settings.namespace).raw) == []


async def test_the_webhook_port_serves_no_resource_data(ingest: ServedIngest, http: aiohttp.ClientSession) -> None:
    # resources, timelines and every admin route live on the admin port (app/admin), never here
    for path in ("/resources/pg/dep_1", "/api/resources/pg/dep_1", "/api/overview", "/openapi.json", "/",
                 "/quarantine", "/effects"):
        async with http.get(f"{ingest.url}{path}") as resp:
            assert resp.status in (404, 405), (path, resp.status)


@pytest.mark.parametrize("target", ["/webhooks/pg", "/correlations/pg/deposits/dep_1"])
async def test_a_body_shorter_than_its_content_length_gets_408_and_the_socket_closed(
        ingest: ServedIngest, target: str) -> None:
    method = b"POST" if target.startswith("/webhooks") else b"PUT"
    request = (method + b" " + target.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test-token\r\n"
               b"PG-Signature: t=1,v1=00\r\nContent-Length: 100\r\n\r\n" + b'{"id":')
    answer, took = await raw_request(ingest.url, request, within=READ_TIMEOUT_S + 4)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"the body did not arrive within 0.5 s" in answer
    assert READ_TIMEOUT_S * 0.9 <= took < READ_TIMEOUT_S + 3


async def test_slow_headers_are_cut_off(ingest: ServedIngest) -> None:
    """Slowloris: a header line every 0.1 s never completes a request; the socket is closed."""
    parts = urlsplit(ingest.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)

    async def drip() -> None:
        writer.write(b"POST /webhooks/pg HTTP/1.1\r\nHost: x\r\n")
        try:
            while True:
                await asyncio.sleep(0.1)
                writer.write(b"X-Slow: 1\r\n")
                await writer.drain()
        except ConnectionError:
            return

    dripping = asyncio.create_task(drip())
    started = time.monotonic()
    try:
        async with asyncio.timeout(READ_TIMEOUT_S + 4):
            answer = await reader.read()
    finally:
        dripping.cancel()
        writer.close()
    assert answer == b""  # closed without an answer: no request was ever complete
    assert time.monotonic() - started < READ_TIMEOUT_S + 3


async def readyz(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    async with http.get(f"{url}/readyz") as resp:
        return resp.status, await resp.json(), time.monotonic() - started


async def until_ready(http: aiohttp.ClientSession, url: str, within: float) -> None:
    async with asyncio.timeout(within):
        while (await readyz(http, url))[0] != 200:
            await asyncio.sleep(0.2)


async def test_readiness_is_kafka_answering_now_and_names_postgres_away(postgres: PostgresServer, namespace: str,
                                                     tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path / "kafka")  # our own broker: this test stops it
    broker.start()
    try:
        s = make_settings(broker.bootstrap, postgres.dsn, namespace)
        await prepare(s)
        with serve_ingest(s) as ingest:
            async with aiohttp.ClientSession() as http:
                await until_ready(http, ingest.url, 30)
                assert (await readyz(http, ingest.url))[1] == {"kafka": True, "postgres": True}

                # A broker that holds the connection but does not answer: 503 by the deadline.
                assert broker.pid is not None
                os.kill(broker.pid, signal.SIGSTOP)
                try:
                    status, body, took = await readyz(http, ingest.url)
                finally:
                    os.kill(broker.pid, signal.SIGCONT)
                assert (status, body["kafka"], body["postgres"]) == (503, False, True), body
                assert body["errors"] == {"kafka": "no answer within 2 s"}
                assert took < 3
                await until_ready(http, ingest.url, 30)

                # A stopped broker: 503 for as long as it is stopped (cached metadata said 200).
                await asyncio.to_thread(broker.stop)
                for _ in range(5):
                    status, body, took = await readyz(http, ingest.url)
                    assert (status, body["kafka"], body["postgres"]) == (503, False, True), body
                    assert "kafka" in body["errors"]
                    assert took < 3
                    await asyncio.sleep(0.3)
                await asyncio.to_thread(broker.start)
                await until_ready(http, ingest.url, 60)

        # PostgreSQL that does not answer (nothing listens at the DSN's port): named, but the ingest is
        # ready once Kafka answers (DESIGN.md §3: storing a webhook needs Kafka only).
        unreachable = s.with_overrides(postgres_dsn=Secret(f"postgresql://postgres@127.0.0.1:{spare_port()}/postgres"))
        with serve_ingest(unreachable) as ingest:
            async with aiohttp.ClientSession() as http:
                async with asyncio.timeout(30):
                    while True:
                        status, body, took = await readyz(http, ingest.url)
                        assert body["postgres"] is False and took < 3, body
                        if body["kafka"]:  # the producer connects in the background
                            break
                        assert status == 503, body
                        await asyncio.sleep(0.2)
                assert status == 200, body
                assert set(body["errors"]) == {"postgres"}
                assert "127.0.0.1" not in str(body["errors"])  # no internal address on the public port
    finally:
        broker.stop()
