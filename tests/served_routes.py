"""What each long-running process serves on each of its ports (named as the Helm chart names its
container ports: ``http``, ``admin``, ``metrics``), read from the code, so that a probe of the chart
pointing at a path or port the process does not serve fails (tests/integration/test_helm_chart.py).

- the ingest's and the admin's own ports: the GET routes of the application their ``create_app`` builds;
- the metrics port: :func:`app.metrics.metrics_app`'s routes, with /readyz when the process's module
  hands a readiness to ``start_service`` / ``serve_metrics`` (found in its source, argument bound to
  the function's signature); the worker's: the paths its Faust app serves (``serve_bytes``).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from app import metrics
from app.admin import app as admin_app
from app.ingest import app as ingest_app
from app.readiness import Readiness
from app.setting_uses import USES
from app.settings import DEV_DEFAULTS, Settings
from tests import parsing

ROOT = Path(__file__).resolve().parents[1]
MODULES = {"ingest": "app/ingest/app.py", "worker": "app/worker/app.py", "projector": "app/projector.py",
           "effects": "app/effects.py", "fetcher": "app/fetcher.py", "admin": "app/admin/app.py"}
# The calls that start a metrics port, and the parameter that adds /readyz to it
STARTERS: dict[str, Callable[..., object]] = {"start_service": metrics.start_service,
                                               "serve_metrics": metrics.serve_metrics}


def calls(process: str, name: str) -> list[ast.Call]:
    tree = parsing.parse((ROOT / MODULES[process]).read_text(encoding="utf-8"))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and (
        getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)]


def passes_readiness(process: str) -> bool | None:
    """Whether the process's module starts its metrics port with a readiness (None: it starts none)."""
    found = None
    for name, starter in STARTERS.items():
        for call in calls(process, name):
            bound = inspect.signature(starter).bind(*call.args, **{k.arg: k.value for k in call.keywords if k.arg})
            found = bool(found) or "readiness" in bound.arguments
    return found


def get_paths(app: web.Application) -> frozenset[str]:
    return frozenset(route.resource.canonical for route in app.router.routes()
                     if route.method == "GET" and route.resource is not None)


def own_port(process: str) -> dict[str, frozenset[str]]:
    env = {**DEV_DEFAULTS, "ORDERLY_ADMIN_TOKEN": "a-token-for-the-routes-only"}
    if process == "ingest":
        return {"http": get_paths(ingest_app.create_app(Settings.from_env(env, USES["ingest"])))}
    if process == "admin":
        return {"admin": get_paths(admin_app.create_app(Settings.from_env(env, USES["admin"])))}
    return {}


def metrics_port(process: str) -> frozenset[str]:
    if process == "worker":  # Faust's web server, serving only what app/worker/app.py hands it
        return frozenset(ast.literal_eval(call.args[0]) for call in calls("worker", "serve_bytes"))
    readiness = passes_readiness(process)
    assert readiness is not None, f"{MODULES[process]} starts no metrics port"
    return get_paths(metrics.metrics_app(CollectorRegistry(), Readiness() if readiness else None))


def served(process: str) -> dict[str, frozenset[str]]:
    """Port name -> the GET paths ``process`` serves there."""
    return {**own_port(process), "metrics": metrics_port(process)}
