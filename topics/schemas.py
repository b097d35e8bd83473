"""JSON Schemas of the projection topics, one per topic and record kind, generated from the typed
records (schema layer: imports nothing from app/, like the rest of topics/).

orderly.decisions and orderly.effects have one kind each (topics/records.py's Decision, Effect);
orderly.facts has one per fact kind (topics/schemas_facts.py); orderly.state has one per gateway,
whose snapshot types live with the gateways' reducers, so the caller hands them in
(app/export.py's ``published``). The schemas are generated from the JSON shape of the types
(msgspec.json.schema, which reads dataclasses and Structs alike), with the types' docstrings left
out, so refactoring a record's Python class without changing its JSON changes no schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from topics.records import Decision, Effect
from topics.schemas_facts import FACT_DATA, FactRecord

Schema = dict[str, Any]
DIALECT = "https://json-schema.org/draft/2020-12/schema"
BASE_ID = "https://orderly.example/schemas/"

# topic suffix -> (key, how a record's kind is told, what the topic is)
TOPICS: dict[str, tuple[str, str, str]] = {
    "state": ("gateway:resource_id", "the key's gateway (before the first ':')",
              "the accepted state of each resource; compacted: the latest snapshot per key stays"),
    "decisions": ("gateway:resource_id", "one kind: decision",
                  "the outcome of every delivery, in each resource's log order (the timeline)"),
    "facts": ("the fact's own id (field key)", "the field kind",
              "append-only facts (fill legs, overpayment flags, correlations, card events, notes)"),
    "effects": ("the effect's dedupe_key", "one kind: effect",
                "one-shot business effects, as the effects worker delivers them"),
}

OUTCOMES = ("applied", "stale", "duplicate", "parked", "unparked", "quarantined", "synced")
DECISION_FIELDS = {
    "delivery_id": "the delivery this decision is about (a parked then unparked delivery has two decisions)",
    "outcome": "one of " + ", ".join(OUTCOMES),
    "received_at_ms": "when the ingest received the delivery, unix milliseconds",
    "seq": "the resource's decision ordinal, 1, 2, 3 ... in log order (a set-aside record's decision takes the "
           "next one without keeping it); (gateway, resource_id, delivery_id, seq) identifies a decision",
    "sequence": "the gateway's own sequence number of the event, where it has one (pg, card)",
    "row": "the read-model row after an applied transition",
    "table": "the read-model table of row",
    "payload": "the event as the gateway sent it (for a correlation: its fields)",
    "error": "why the delivery was not applied as sent (quarantined, or an applied delivery with a caveat)",
}
EFFECT_FIELDS = {
    "dedupe_key": "deterministic: the same effect always has the same key; sinks dedupe on it",
    "caused_by": "the delivery id whose applied transition emitted it",
    "payload": "the effect's body as delivered to the merchant",
}


def _inline(node: Any, defs: Mapping[str, Any]) -> Any:
    """``node`` with every ``$ref`` replaced by its definition and titles and descriptions (the
    Python docstrings) dropped: the records hold no recursive types."""
    if isinstance(node, list):
        return [_inline(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _inline(defs[node["$ref"].rsplit("/", 1)[1]], defs)
    return {k: _inline(v, defs) for k, v in node.items() if k not in ("title", "description")}


def shape(tp: Any) -> Schema:
    """The JSON shape of ``tp`` (a dataclass or a Struct) as a self-contained schema."""
    generated = msgspec.json.schema(tp)
    inlined: Schema = _inline(generated, generated.get("$defs", {}))
    return inlined


def _described(schema: Schema, fields: Mapping[str, str]) -> Schema:
    for name, text in fields.items():
        schema["properties"][name]["description"] = text
    return schema


def record_schema(namespace: str, suffix: str, kind: str, body: Schema, description: str) -> Schema:
    key, _, topic_text = TOPICS[suffix]
    topic = f"{namespace}.{suffix}"
    return {"$schema": DIALECT, "$id": f"{BASE_ID}{topic}/{kind}.schema.json",
            "title": f"{topic} record of kind {kind}", "description": f"{description} Topic: {topic_text}.",
            "x-orderly-topic": topic, "x-orderly-key": key, "x-orderly-kind": kind, **body}


def fact_schema(kind: str, data: type[msgspec.Struct]) -> Schema:
    body = shape(FactRecord)
    body["properties"]["kind"] = {"const": kind}
    body["properties"]["data"] = shape(data)
    return body


def build(states: Mapping[str, Any], namespace: str = "orderly") -> dict[str, Schema]:
    """Every published schema by its path under docs/schemas/ (``<topic>/<kind>.schema.json``);
    ``states`` maps each gateway to the type of its orderly.state snapshot."""
    out: dict[str, Schema] = {}

    def put(suffix: str, kind: str, body: Schema, description: str) -> None:
        out[f"{namespace}.{suffix}/{kind}.schema.json"] = record_schema(namespace, suffix, kind, body, description)

    for gateway, snapshot in sorted(states.items()):
        put("state", gateway, shape(snapshot), f"The {gateway} gateway's resource state snapshot.")
    put("decisions", "decision", _described(shape(Decision), DECISION_FIELDS),
        "What was decided for one delivery of a resource.")
    for kind, data in sorted(FACT_DATA.items()):
        doc = (data.__doc__ or kind).strip().splitlines()[0]
        put("facts", kind, fact_schema(kind, data), f"A fact of kind {kind}: {doc}")
    put("effects", "effect", _described(shape(Effect), EFFECT_FIELDS), "A one-shot business effect.")
    out["index.json"] = index(out, namespace)
    return out


def index(schemas: Mapping[str, Schema], namespace: str) -> Schema:
    """Each topic with its key, how its kinds are told apart, and its kinds' schema files."""
    topics = {}
    for suffix, (key, kind_of, text) in TOPICS.items():
        topic = f"{namespace}.{suffix}"
        kinds = {s["x-orderly-kind"]: path for path, s in sorted(schemas.items()) if s.get("x-orderly-topic") == topic}
        topics[topic] = {"key": key, "kind": kind_of, "about": text, "kinds": kinds}
    return {"topics": topics}


def dumps(schema: Schema) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write(directory: Path, schemas: Mapping[str, Schema]) -> list[Path]:
    written = []
    for path, schema in sorted(schemas.items()):
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(dumps(schema))
        written.append(target)
    return written


def read(directory: Path) -> dict[str, Schema]:
    """The schemas under ``directory`` (as ``write`` laid them out), by relative path."""
    return {p.relative_to(directory).as_posix(): json.loads(p.read_text())
            for p in sorted(directory.glob("*/*.schema.json"))}


def columns(schemas: Mapping[str, Schema], topic: str) -> dict[str, Schema]:
    """The top-level fields of ``topic``'s records over all its kinds, each with its schemas
    (one per kind that has it, in kind order): what a table of the topic has as columns."""
    found: dict[str, list[Schema]] = {}
    for _path, schema in sorted(schemas.items()):
        if schema.get("x-orderly-topic") == topic:
            for name, field in schema["properties"].items():
                found.setdefault(name, []).append(field)
    return {name: {"anyOf": fields} if len(fields) > 1 else fields[0] for name, fields in found.items()}
