"""A pg gap backfill the gateway's API cannot serve now is not lost: the fetcher marks the gap (what
late events left of it) not requested, so the projector asks again; and a malformed request is set
aside."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import asyncpg
import orjson
from aiohttp import web

from app.bootstrap import prepare
from app.producer import KeyedProducer
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from projections.migrate import quote_ident
from tests.pipeline import Pipeline
from tests.support import make_settings, serve_in_thread
from topics.catalog import names


def test_an_unanswered_backfill_is_requested_again_and_a_malformed_one_set_aside(
        kafka: KafkaBroker, postgres: PostgresServer, tmp_path: Path) -> None:
    calls: list[str] = []

    async def unavailable(request: web.Request) -> web.Response:
        calls.append(request.query_string)
        return web.Response(status=503)

    api = web.Application()
    api.router.add_get("/v1/pay/events", unavailable)
    with serve_in_thread(api) as api_url:
        s = make_settings(kafka.bootstrap, postgres.dsn, f"bf{uuid.uuid4().hex[:8]}", api_urls={"pg": api_url},
                          data_dir=tmp_path)
        asyncio.run(prepare(s))

        async def setup() -> None:
            conn = await asyncpg.connect(s.postgres_dsn.reveal(),
                                         server_settings={"search_path": quote_ident(s.namespace)})
            try:
                # what late events left of the requested gap 11-20 (12 arrived meanwhile), and a gap
                # after it whose own request is under way
                await conn.execute("INSERT INTO pg_sequence_gaps VALUES ('pg', 11, 11, now() - interval '5 days', "
                                   "now()), ('pg', 13, 20, now() - interval '5 days', now()), "
                                   "('pg', 30, 31, now() - interval '5 days', now())")
            finally:
                await conn.close()
            producer = KeyedProducer(s.kafka_bootstrap)
            await producer.start()
            try:
                n = names(s.namespace)
                await producer.send_and_wait(n.fetch, b"pg:sequence:11", orjson.dumps(
                    {"gateway": "pg", "kind": "backfill", "since_sequence": 10, "until_sequence": 20}))
                await producer.send_and_wait(n.fetch, b"pg:sequence:x", b"{not json")
            finally:
                await producer.stop()

        asyncio.run(setup())
        pipeline = Pipeline(s, tmp_path)
        pipeline.start("fetcher")
        try:
            async def marked() -> list[int]:
                conn = await asyncpg.connect(s.postgres_dsn.reveal(),
                                             server_settings={"search_path": quote_ident(s.namespace)})
                try:
                    return [r[0] for r in await conn.fetch(
                        "SELECT start_seq FROM pg_sequence_gaps WHERE backfill_requested_at IS NOT NULL "
                        "ORDER BY start_seq")]
                finally:
                    await conn.close()

            deadline = time.monotonic() + 60
            while asyncio.run(marked()) != [30]:  # both pieces asked for again, not the other gap
                assert time.monotonic() < deadline, pipeline.log("fetcher")[-3000:]
                pipeline.assert_alive()
                time.sleep(0.5)
            assert calls and calls[0].startswith("since_sequence=10")

            async def quarantined() -> list[bytes]:
                from tests.support import read_topic
                return [r.value for r in await read_topic(s.kafka_bootstrap, names(s.namespace).quarantine)]

            while b"{not json" not in asyncio.run(quarantined()):
                assert time.monotonic() < deadline, pipeline.log("fetcher")[-3000:]
                time.sleep(0.5)
            pipeline.assert_alive()
        finally:
            pipeline.stop()
