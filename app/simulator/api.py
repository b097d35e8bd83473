"""The gateways' GET APIs, answered from the simulator's truth (DESIGN.md §2): what the fetcher
calls when an event stayed parked too long or a sequence gap outlived its retry window. Each
gateway's routes are its simulator module's (``GatewaySimulator.api``; how they answer:
app/simulator/gateway_api.py). Every request is counted in the app's ``Served`` (``app[SERVED]``),
with each card answer given.
"""

from __future__ import annotations

from aiohttp import web

from app.simulator import plugins
from app.simulator.gateway_api import FETCH_APIS, ApiContext, Served
from app.simulator.lifecycles import Emitted, Truth

__all__ = ["FETCH_APIS", "SERVED", "Served", "build"]

SERVED = web.AppKey("served", Served)


def build(truth: Truth, events: list[Emitted], fetch_api: str = "truth") -> web.Application:
    """``events`` is read on every request, so a test can add to it while the API runs."""
    if fetch_api not in FETCH_APIS:
        raise ValueError(f"fetch_api must be one of {', '.join(FETCH_APIS)}, not {fetch_api!r}")
    served = Served()
    context = ApiContext(truth, events, fetch_api, served)
    app = web.Application()
    app[SERVED] = served
    for name in plugins.simulated():
        routes = plugins.simulator_of(name).api
        if routes is not None:
            app.router.add_routes(routes(context))
    return app
