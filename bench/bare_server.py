"""The ceiling: an aiohttp handler that reads the body and answers 200, nothing else."""

from __future__ import annotations

import sys

from aiohttp import web


async def handle(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"status": "stored"})


if __name__ == "__main__":
    import uvloop

    uvloop.install()  # the ingest runs on uvloop (ORDERLY_LOOP): the ceiling gets the same loop
    app = web.Application(client_max_size=1024 * 1024)
    app.router.add_post("/webhooks/{gateway}", handle)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
