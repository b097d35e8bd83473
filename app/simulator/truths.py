"""Random lifecycles from the gateway documents' state machines, and their delivery histories
(pure, seeded; see app/simulator/histories.py for the delivery rules and the choice of fetches).
Each gateway's generator is its simulator module's (app/simulator/<name>.py, ``generate``), found
through app/simulator/plugins.py; what they share is here.

Each event's ``fact`` says what the gateway meant by it, so the oracle reasons from the lifecycle
and never has to read a body back: pg the object's version and status, card the kind and amount,
paymos the status and the event's position in the lifecycle (its true order).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

from app.simulator.histories import (
    History,
)
from app.simulator.plugins import simulator_of

T0_MS = 1_796_000_000_000


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make(gateway: str, seed: int, tag: str = "", first_edition: bool = False) -> History:
    """The history of ``gateway`` for ``seed``: the same seed gives the same history (``tag``
    prefixes its resource ids, so a stack can take the same seeds twice). The generator is the
    gateway's simulator declaration's (app/simulator/plugins.py); ``first_edition``: as it was when
    tests/unit/data/decide_golden.json.gz was made (that test's inputs stay what they were)."""
    sim = simulator_of(gateway)
    generate = sim.first_edition if first_edition and sim.first_edition is not None else sim.generate
    return generate(random.Random(f"{gateway}:{seed}"), seed, f"{tag}{seed}")
