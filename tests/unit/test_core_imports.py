"""The pure core depends on no wiring: importing every module of app/core loads neither the gateway
registry nor the simulator (the worker, replay and the simulation check hand the planner the
registry's table), nor any I/O library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
CORE = sorted(f"app.core.{p.stem}" for p in (ROOT / "app" / "core").glob("*.py") if p.stem != "__init__")


def loaded_by(modules: list[str]) -> set[str]:
    """The modules a fresh interpreter has loaded after importing ``modules``."""
    code = "import sys, json\n" + "".join(f"import {m}\n" for m in modules) + "print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, check=True,
                         env={"PYTHONPATH": str(ROOT)})
    return set(orjson.loads(out.stdout))


def test_the_core_loads_neither_the_registry_nor_the_simulator_nor_io() -> None:
    assert "app.core.dispatch" in CORE and len(CORE) >= 7
    loaded = loaded_by(CORE)
    assert "app.core.dispatch" in loaded
    forbidden = {m for m in loaded if m == "app.gateways.registry" or m.startswith("app.simulator")
                 or m.split(".")[0] in ("asyncio", "faust", "aiokafka", "asyncpg", "aiohttp")}
    assert forbidden == set()
