"""What the batch planner needs of a gateway's reducer, and the gateway table it is handed (pure
layer). The planner imports no gateway list: the worker, replay and the simulation check pass the
registry's table in, so the core depends on no wiring (and a test can hand it a table of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from app.core.model import Decision, Delivery
from app.gateways.base import Route

St = TypeVar("St")  # the gateway's state: a msgspec Struct whose JSON is the stored format
Ev = TypeVar("Ev")  # the gateway's typed event, as its adapter read it


@dataclass(frozen=True)
class Reducer(Generic[St, Ev]):
    """A gateway's decisions and the codecs of its state.

    ``read(raw, checked)`` is the adapter's one read of a body: the typed event, or the quarantine
    Route of a body it refuses (``checked``: the ingest's adapter took it already). ``load`` and
    ``dump`` are the state's codec (what orderly.state's changelog holds); ``snapshot`` is what
    orderly.state publishes of it. ``correlate`` decides a merchant's correlation record of the
    resource (``record: correlation`` in orderly.raw: pg's deposit mappings), for a gateway that takes them.
    ``snapshot_type``: the type ``snapshot`` encodes, for the topic's published schema.
    """

    read: Callable[[bytes, bool], Ev | Route]
    apply_event: Callable[[St | None, Ev, Delivery], tuple[St, list[Decision]]]
    load: Callable[[bytes], St]
    dump: Callable[[St], bytes]
    snapshot: Callable[[St], bytes]
    correlate: Callable[[St | None, bytes, Delivery], tuple[St, list[Decision]]] | None = None
    # the type ``snapshot`` encodes: orderly.state's published JSON Schema (docs/schemas, app/export.py)
    snapshot_type: type | None = None


def state_codec(state: type[St]) -> tuple[Callable[[bytes], St], Callable[[St], bytes]]:
    """``load`` and ``dump`` of a gateway's state struct: its JSON is what orderly.state's changelog
    holds, so a field, once released, keeps its name (one decoder and one encoder, built once)."""
    return msgspec.json.Decoder(state).decode, msgspec.json.Encoder().encode


class HasReducer(Protocol):
    """A row of the gateway table (the registry's Gateway is one)."""

    @property
    def reducer(self) -> Reducer[Any, Any]: ...


Gateways = Mapping[str, HasReducer]
