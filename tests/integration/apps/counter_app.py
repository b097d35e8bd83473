"""A tiny Faust app for the table-recovery test: counts messages per key in a changelogged table.

Configured by command-line flags so the test can run it as a real worker process and kill it.
A message whose value is ``report`` makes the agent publish ``key=count`` to the output topic.
"""

from __future__ import annotations

import os
import sys

import faust

APP_ID, BROKER, SOURCE, OUTPUT, DATADIR, WEB_PORT = sys.argv[1:7]

app = faust.App(
    APP_ID,
    broker=f"kafka://{BROKER}",
    store="memory://",
    processing_guarantee="exactly_once",
    topic_partitions=2,
    topic_replication_factor=1,
    datadir=DATADIR,
    web_bind="127.0.0.1",
    web_port=int(WEB_PORT),
    broker_session_timeout=6,
    broker_heartbeat_interval=1,
)
source = app.topic(SOURCE, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
output = app.topic(OUTPUT, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
counts = app.Table("counts", default=int, key_type=str, value_type=int, partitions=2)


@app.agent(source)
async def count(stream: faust.StreamT[bytes]) -> None:
    async for key, value in stream.items():
        name = key.decode()
        counts[name] += 1
        if value == b"report":
            await output.send(key=key, value=f"{name}={counts[name]}".encode())


if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "-l", os.environ.get("FAUST_LOGLEVEL", "warn")]
    app.main()
