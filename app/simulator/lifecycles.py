"""What realistic resource lifecycles are made of: the events they emit and the truth they end at
(pure, seeded). Each gateway's generator is its simulator module's ``lifecycle``
(app/simulator/<name>.py): it returns the events in creation order (``Emitted``: gateway, resource
key, body, created_at) and fills the truth the read models must end at. Nothing here touches the network.
Each gateway's simulator declaration (app/simulator/<name>.py's ``SIMULATOR.lifecycles``) names its
generator here; `orderly simulate`, `dev` and `demo` find it through app/simulator/plugins.py.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

T0_MS = 1_796_000_000_000  # a fixed epoch for the gateway's own clocks: runs are reproducible


@dataclass(frozen=True)
class Emitted:
    gateway: str
    resource: str
    body: bytes
    created_ms: int


@dataclass
class Truth:
    pg_deposits: dict[str, str] = field(default_factory=dict)  # id -> final status
    pg_withdrawals: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # status, filled, remaining
    balances: dict[str, int] = field(default_factory=dict)  # user -> minor units
    correlations: dict[str, dict[str, str]] = field(default_factory=dict)
    card: dict[str, dict[str, Any]] = field(default_factory=dict)  # ref -> GET /payments answer
    paymos: dict[str, str] = field(default_factory=dict)  # id -> final status
    # any other gateway's final states, under its name: its simulator module fills and reads its own
    by_gateway: dict[str, dict[str, Any]] = field(default_factory=dict)


def pick(rng: random.Random, paths: list[tuple[float, list[str]]]) -> list[str]:
    return rng.choices([p for _, p in paths], weights=[w for w, _ in paths])[0]
