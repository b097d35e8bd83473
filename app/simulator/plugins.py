"""Each gateway's simulator, found through its registry line (simulator layer).

A gateway's registry line names its simulator module as a path string (``simulator="app.simulator.pg"``):
the registry, which the ingest and the worker load, never imports the simulator; only the
simulator imports that module (importlib, here) and reads its ``SIMULATOR``, a
:class:`GatewaySimulator`. ``orderly simulate --check``, ``orderly simulate``, ``orderly dev`` and
``orderly demo`` iterate these and name no gateway. A new gateway's simulator is its module
``app/simulator/<name>.py`` ending in ``SIMULATOR = GatewaySimulator(...)`` and the ``simulator``
field of its registry line (docs/adding-a-gateway.md).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.gateways import registry
from app.simulator.expected import Fetched
from app.simulator.gateway_api import Routes
from app.simulator.histories import History
from app.simulator.lifecycles import Emitted, Truth
from app.simulator.oracle import Outcome


@dataclass(frozen=True)
class DemoInput:
    """What `orderly demo` hands a gateway's expected read models: its events the gateway did not
    give up on (in creation order), the merchant's correlations and the answers its GET API gave."""

    events: list[Emitted]
    correlations: dict[str, dict[str, str]]
    fetched: Sequence[Fetched] = ()


@dataclass(frozen=True)
class DemoTable:
    """One line of `orderly demo`'s table: a read model against what the documents expect of it and
    against the gateway's truth. ``query`` selects the resource id, then the compared columns (one
    column: its value; several: a tuple); a resource without a row reads as ``missing``."""

    name: str
    query: str
    expected: Callable[[DemoInput], dict[str, Any]]
    truth: Callable[[Truth], dict[str, Any]]
    missing: Any = None


@dataclass(frozen=True)
class GatewaySimulator:
    """What the simulator knows of one gateway, from its documents (never from app/core)."""

    # `simulate --check`: one seeded history (rng, seed, the stem of its resource ids), and the
    # oracle of what the read models and the merchant must end at after it
    generate: Callable[[random.Random, int, str], History]
    oracle: Callable[[History], Outcome]
    # the columns of each read-model table's rows the check compares (the oracle's ``rows``)
    rows: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    facts: frozenset[str] = frozenset()  # the kinds of fact the check compares
    # what a row written on the way breaks of its table's CHECKs (every row, not only the last)
    row_breaks: Mapping[str, Callable[[Mapping[str, Any]], set[str]]] = field(default_factory=dict)
    # `orderly simulate`/`dev`/`demo`: about ``count`` resources' events in creation order, and their truth
    lifecycles: Callable[[random.Random, int, Truth], list[Emitted]] | None = None
    # `orderly demo`: its lifecycles of ``demo_sizes`` resources (each scaled by `--scale`)
    demo: Callable[[random.Random, tuple[int, ...], Truth], list[Emitted]] | None = None
    demo_sizes: tuple[int, ...] = ()
    # `orderly demo`: every tenth resource's first event comes late (card's authorisation, so its
    # captures wait parked long enough for the fetcher)
    late_first: bool = False
    demo_tables: tuple[DemoTable, ...] = ()
    # `orderly simulate --api-port`, `demo`, tests: its GET API's routes, answered from the truth
    api: Routes | None = None
    # `orderly simulate`: seconds between a failed live attempt and the next, in the gateway's own
    # time (compressed by Chaos.time_scale); None: the simulator's default (app/simulator/deliver.py)
    retry_s: tuple[float, ...] | None = None
    # the cases its generator claims to produce (``case_names``) and which of them one history holds
    # (``cases``): tests/unit/test_simulator_cases.py runs many seeds and expects to see every one
    case_names: tuple[str, ...] = ()
    cases: Callable[[History], set[str]] | None = None
    # its generator as it was when tests/unit/data/decide_golden.json.gz was made (that file's
    # inputs must not change); None: ``generate`` is
    first_edition: Callable[[random.Random, int, str], History] | None = None


def simulator(name: str) -> GatewaySimulator | None:
    """The simulator of the registered gateway ``name``, or None (unknown, or it has none)."""
    gateway = registry.find(name)
    if gateway is None or gateway.simulator is None:
        return None
    found: GatewaySimulator = importlib.import_module(gateway.simulator).SIMULATOR
    return found


def simulator_of(name: str) -> GatewaySimulator:
    found = simulator(name)
    if found is None:
        raise KeyError(f"no simulator for gateway {name!r}")
    return found


def simulated() -> list[str]:
    """The registered gateways with a simulator, in the registry's order."""
    return [name for name in registry.GATEWAYS if simulator(name) is not None]


def row_fields() -> dict[str, tuple[str, ...]]:
    """Every simulated gateway's compared columns, by table."""
    return {table: columns for name in simulated() for table, columns in simulator_of(name).rows.items()}
