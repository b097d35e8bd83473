"""Whether a projection topic's schemas evolved compatibly from a release's (schema layer).

DESIGN.md §4: a published schema changes only by adding optional fields. Against the release's
schemas this finds every field removed, retyped, added as required or no longer always present,
and every record kind removed; a consumer written against the release reads every record of the
current one when the list is empty. Run by tests/unit/test_analytics_schemas.py against
docs/schemas/released/<version>/.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from topics.schemas import Schema, read

RELEASED = Path("docs/schemas/released")


def json_types(node: Schema) -> frozenset[str]:
    """The JSON types a value of ``node`` may have ("any": no constraint)."""
    if "const" in node:
        value = node["const"]
        return frozenset({"null" if value is None else "boolean" if isinstance(value, bool)
                          else "integer" if isinstance(value, int) else "string" if isinstance(value, str)
                          else "object" if isinstance(value, dict) else "array"})
    if "anyOf" in node:
        found: set[str] = set()
        for branch in node["anyOf"]:
            found |= json_types(branch)
        return frozenset(found)
    declared = node.get("type")
    if declared is None:
        return frozenset({"any"})
    return frozenset([declared] if isinstance(declared, str) else declared)


def _branches(node: Schema, kind: str) -> list[Schema]:
    if "anyOf" in node:
        return [b for branch in node["anyOf"] for b in _branches(branch, kind)]
    return [node] if kind in json_types(node) else []


def field_problems(old: Schema, new: Schema, where: str) -> list[str]:
    """What makes ``new`` unreadable by a consumer of ``old`` at ``where``."""
    old_types, new_types = json_types(old), json_types(new)
    if old_types != new_types:
        return [f"{where}: retyped from {sorted(old_types)} to {sorted(new_types)}"]
    if "const" in old and old.get("const") != new.get("const"):
        return [f"{where}: constant {old['const']!r} became {new.get('const')!r}"]
    problems = []
    for old_object, new_object in zip(_branches(old, "object"), _branches(new, "object"), strict=False):
        problems += _object_problems(old_object, new_object, where)
    for old_array, new_array in zip(_branches(old, "array"), _branches(new, "array"), strict=False):
        if "items" in old_array:
            problems += field_problems(old_array["items"], new_array.get("items", {}), f"{where}[]")
    return problems


def _object_problems(old: Schema, new: Schema, where: str) -> list[str]:
    old_props: Mapping[str, Schema] = old.get("properties", {})
    new_props: Mapping[str, Schema] = new.get("properties", {})
    old_required, new_required = set(old.get("required", ())), set(new.get("required", ()))
    problems = []
    for name, field in old_props.items():
        if name not in new_props:
            problems.append(f"{where}.{name}: removed")
            continue
        if name in old_required and name not in new_required:
            problems.append(f"{where}.{name}: no longer always present")
        problems += field_problems(field, new_props[name], f"{where}.{name}")
    for name in new_props.keys() - old_props.keys():
        if name in new_required:
            problems.append(f"{where}.{name}: added as required (a new field must be optional)")
    return problems


def incompatibilities(released: Mapping[str, Schema], current: Mapping[str, Schema]) -> list[str]:
    """Every incompatible change from ``released`` to ``current`` (schemas by path)."""
    problems = []
    for path, old in sorted(released.items()):
        new = current.get(path)
        if new is None:
            problems.append(f"{path}: record kind removed")
            continue
        problems += field_problems(old, new, path.removesuffix(".schema.json"))
    return problems


def latest_release(root: Path) -> tuple[str, dict[str, Any]]:
    """The newest released version under ``root`` (by its numbers) with its schemas."""
    versions = sorted((p.name for p in root.iterdir() if p.is_dir()),
                      key=lambda v: tuple(int(x) for x in v.split(".")))
    if not versions:
        raise FileNotFoundError(f"no released schemas under {root}")
    return versions[-1], read(root / versions[-1])
