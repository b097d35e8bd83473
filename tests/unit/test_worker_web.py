"""The worker's HTTP port serves /metrics (and Faust's one-line status index) and nothing else:
Faust's table pages would serve resource state (the admin's job, behind its token), its router
pages the group's topology, its statistics the app's internals."""

from __future__ import annotations

import asyncio
from pathlib import Path

from app.worker.app import build_app
from tests.support import make_settings


def test_the_worker_port_serves_only_metrics(tmp_path: Path) -> None:
    settings = make_settings("127.0.0.1:1", "postgresql://unused@127.0.0.1:1/x", "webcheck",
                             metrics_port=9999, data_dir=tmp_path)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        app = build_app(settings)
        app.web.init_server()
        web_app = app.web.web_app  # type: ignore[attr-defined]  # aiohttp's, behind Faust's untyped Web
        paths = {r.resource.canonical for r in web_app.router.routes() if r.resource is not None}
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    assert paths == {"/", "/metrics"}, paths  # "/": Faust's production index, {"status": "OK"} only
