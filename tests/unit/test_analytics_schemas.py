"""The projection topics' published JSON Schemas (docs/schemas/): generated == committed (drift),
compatible with the last release's, and true of what the real core writes on each topic."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]  # no stubs

from app.core.dispatch import plan_batch
from app.export import STATE_SNAPSHOTS, arrow_type, layout, published
from app.gateways.registry import GATEWAYS
from app.simulator import check, truths
from topics.catalog import names
from topics.records import Decision, Effect
from topics.schemas import Schema, dumps, read, shape
from topics.schemas_compat import incompatibilities, json_types, latest_release
from topics.schemas_facts import FACT_DATA

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "schemas"
CURRENT = published()


def test_the_committed_schemas_are_the_generated_ones() -> None:
    committed = {p.relative_to(DOCS).as_posix() for p in DOCS.glob("*.json")} | set(read(DOCS))
    assert committed == set(CURRENT), "run: make docs (python -m app.export --write-schemas docs/schemas)"
    for path, schema in CURRENT.items():
        assert (DOCS / path).read_text() == dumps(schema), \
            f"{path} differs: python -m app.export --write-schemas docs/schemas"


def test_every_schema_is_a_valid_2020_12_schema_with_its_topic_and_kind() -> None:
    for path, schema in CURRENT.items():
        if path == "index.json":
            continue
        Draft202012Validator.check_schema(schema)
        topic, kind = path.removesuffix(".schema.json").split("/")
        assert (schema["x-orderly-topic"], schema["x-orderly-kind"]) == (topic, kind)


def test_every_gateway_has_a_state_schema() -> None:
    built_in = {name for name in GATEWAYS if name != "toy"}  # tests/toy_gateway.py registers a toy one
    assert built_in == set(STATE_SNAPSHOTS), \
        "a gateway's snapshot type belongs in app/export.py's STATE_SNAPSHOTS (then regenerate docs/schemas)"
    assert {f"orderly.state/{g}.schema.json" for g in built_in} <= set(CURRENT)


def test_the_current_schemas_are_compatible_with_the_last_release() -> None:
    version, released = latest_release(DOCS / "released")
    assert version == "0.2.0" and released, "the baseline release is missing"
    assert incompatibilities(released, read(DOCS)) == []


def _decision() -> Schema:
    return copy.deepcopy(CURRENT["orderly.decisions/decision.schema.json"])


def test_the_compatibility_check_finds_each_kind_of_break() -> None:
    released = {"orderly.decisions/decision.schema.json": _decision(),
                "orderly.facts/card_event.schema.json": copy.deepcopy(CURRENT["orderly.facts/card_event.schema.json"])}
    removed, retyped, required, loosened = _decision(), _decision(), _decision(), _decision()
    del removed["properties"]["outcome"]
    retyped["properties"]["received_at_ms"] = {"type": "string"}
    required["properties"]["attempt"] = {"type": "integer"}
    required["required"].append("attempt")
    loosened["required"].remove("seq")
    for changed, expected in ((removed, "outcome: removed"), (retyped, "received_at_ms: retyped"),
                              (required, "attempt: added as required"), (loosened, "seq: no longer always present")):
        found = incompatibilities(released, {**released, "orderly.decisions/decision.schema.json": changed})
        assert len(found) == 1 and expected in found[0], found
    nested = copy.deepcopy(released["orderly.facts/card_event.schema.json"])
    nested["properties"]["data"]["properties"]["sequence"] = {"type": "string"}  # inside a fact's data
    found = incompatibilities(released, {**released, "orderly.facts/card_event.schema.json": nested})
    assert found == ["orderly.facts/card_event.data.sequence: retyped from ['integer', 'null'] to ['string']"]
    found = incompatibilities(released, {"orderly.decisions/decision.schema.json": _decision()})
    assert found == ["orderly.facts/card_event.schema.json: record kind removed"]


def test_adding_an_optional_field_or_a_kind_is_compatible() -> None:
    released = {"orderly.decisions/decision.schema.json": _decision()}
    added = _decision()
    added["properties"]["attempt"] = {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
    assert incompatibilities(released, {"orderly.decisions/decision.schema.json": added,
                                        "orderly.facts/new.schema.json": {"type": "object"}}) == []


@pytest.mark.parametrize("path", sorted(p for p in CURRENT if p != "index.json"))
def test_removing_any_released_field_is_found(path: str) -> None:
    """Every top-level field of every kind: the check is not blind to any of them."""
    for name in CURRENT[path]["properties"]:
        changed = copy.deepcopy(CURRENT[path])
        del changed["properties"][name]
        assert incompatibilities({path: CURRENT[path]}, {path: changed}) == [
            f"{path.removesuffix('.schema.json')}.{name}: removed"]


def stored(store: dict[bytes, bytes], _partition: int, key: bytes) -> bytes | None:
    return store.get(key)


def written_records() -> list[tuple[str, bytes, Any]]:
    """(topic, key, value) of every record the core writes for seeded histories of every gateway."""
    topics = check.TOPICS
    out = []
    for gateway in sorted(STATE_SNAPSHOTS):
        for seed in range(6):
            store: dict[bytes, bytes] = {}
            batch = check.records(truths.make(gateway, seed, "schema"))
            for start in range(0, len(batch), 5):
                plan = plan_batch(topics, GATEWAYS, batch[start:start + 5], partial(stored, store))
                store.update(plan.states)
                out += [(r[0].removeprefix("simcheck."), r[1], orjson.loads(r[2]))
                        for outputs in plan.records.values() for r in outputs
                        if r[0] in (topics.state, topics.decisions, topics.facts, topics.effects)]
    return out


def kind_path(topic: str, key: bytes, value: Any) -> str:
    kind = {"state": key.decode().partition(":")[0], "facts": value.get("kind"),
            "decisions": "decision", "effects": "effect"}[topic]
    return f"orderly.{topic}/{kind}.schema.json"


def test_every_record_the_core_writes_matches_its_kinds_schema_and_has_no_undocumented_field() -> None:
    seen: set[str] = set()
    for topic, key, value in written_records():
        path = kind_path(topic, key, value)
        assert path in CURRENT, f"a record of {topic} of no published kind: {path}"
        schema = CURRENT[path]
        errors = [e.message for e in Draft202012Validator(schema).iter_errors(value)]
        assert not errors, f"{path}: {errors[:3]} in {value}"
        assert set(value) <= set(schema["properties"]), f"{path}: undocumented {set(value) - set(schema['properties'])}"
        if topic == "facts":
            data_fields = set(schema["properties"]["data"]["properties"])
            assert set(value["data"]) <= data_fields, f"{path}: undocumented data {set(value['data']) - data_fields}"
        seen.add(path)
    # every gateway's state and the fact kinds the seeded histories reach were checked
    assert {f"orderly.state/{g}.schema.json" for g in STATE_SNAPSHOTS} <= seen
    reached = {p for p in seen if p.startswith("orderly.facts/")}
    assert len(reached) >= 4 and reached <= {f"orderly.facts/{k}.schema.json" for k in FACT_DATA}, reached
    assert {"orderly.decisions/decision.schema.json", "orderly.effects/effect.schema.json"} <= seen


def test_the_parquet_columns_follow_the_schema() -> None:
    decisions = layout(names().decisions, CURRENT)
    types = {f.name: str(f.type) for f in decisions.schema}
    assert types["received_at_ms"] == "int64" and types["outcome"] == "string" and types["event_id"] == "string"
    assert {"row", "payload", "effects", "facts"} <= decisions.json_fields  # nested: JSON text
    assert json.loads(decisions.schema.metadata[b"orderly.schemas"])  # the published schema travels with the file
    assert arrow_type({"anyOf": [{"type": "integer"}, {"type": "string"}]}) is None  # two types: JSON text
    state = layout(names().state, CURRENT)
    assert "parked" in state.fields and str(state.schema.field("parked").type) == "int64"
    with pytest.raises(ValueError, match="not a projection topic"):
        layout(names().raw, CURRENT)


KINDS = sorted(p for p in CURRENT if p != "index.json")
TYPES = st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "object"},
                         {"anyOf": [{"type": "string"}, {"type": "null"}]}, {"type": "array", "items": {}}])


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from(KINDS), name=st.from_regex(r"[a-z_]{1,12}", fullmatch=True), field=TYPES)
def test_any_optional_field_added_is_compatible(path: str, name: str, field: Schema) -> None:
    changed = copy.deepcopy(CURRENT[path])
    assume(name not in changed["properties"])
    changed["properties"][name] = field
    assert incompatibilities({path: CURRENT[path]}, {path: changed}) == []
    changed["required"] = [*changed.get("required", []), name]  # the same field, required: a break
    assert incompatibilities({path: CURRENT[path]}, {path: changed}) == [
        f"{path.removesuffix('.schema.json')}.{name}: added as required (a new field must be optional)"]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), path=st.sampled_from(KINDS), field=TYPES)
def test_any_field_retyped_is_found(data: st.DataObject, path: str, field: Schema) -> None:
    name = data.draw(st.sampled_from(sorted(CURRENT[path]["properties"])))
    old = CURRENT[path]["properties"][name]
    assume(json_types(old) != json_types(field))
    changed = copy.deepcopy(CURRENT[path])
    changed["properties"][name] = field
    found = incompatibilities({path: CURRENT[path]}, {path: changed})
    assert found and found[0].startswith(f"{path.removesuffix('.schema.json')}.{name}: retyped"), found


# The records as msgspec Structs with the same JSON (as the worker's hot path may want them).
class StructEffect(msgspec.Struct, gc=False):
    dedupe_key: str
    type: str
    gateway: str
    resource_id: str
    payload: dict[str, Any]
    caused_by: str

class StructFact(msgspec.Struct):
    kind: str
    key: str
    data: dict[str, Any]

class StructDecision(msgspec.Struct, gc=False):
    delivery_id: str
    gateway: str
    resource_id: str
    outcome: str
    received_at_ms: int
    seq: int
    event_id: str | None = None
    event_type: str | None = None
    sequence: int | None = None
    row: Mapping[str, Any] | None = None
    table: str | None = None
    effects: list[StructEffect] = msgspec.field(default_factory=list)
    facts: list[StructFact] = msgspec.field(default_factory=list)
    payload: Any = None
    error: str | None = None


def test_the_schemas_follow_the_json_shape_not_the_python_class() -> None:
    """Records as Structs with the same JSON give the same schemas: a refactor of the classes
    cannot move the published contract."""
    assert shape(StructDecision) == shape(Decision)
    assert shape(StructEffect) == shape(Effect)
