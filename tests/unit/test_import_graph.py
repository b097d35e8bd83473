"""No import circles in app/, topics/ or projections/, and the layers import only downwards.

The graph is read from the source (ast), not from ``sys.modules``: every ``import`` counts, those
inside functions and under ``if TYPE_CHECKING:`` too, because an import moved into a function still
ties the two modules together, it only hides the circle from the interpreter. ``from x import y``
where ``x.y`` is a module counts as importing ``x.y`` (``from app.simulator import stack`` needs
stack, not just the package); an import names the most specific module of ours it reaches.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests import parsing

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "topics", "projections")

@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    where: str  # path:line of the import statement


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def ours(name: str, known: dict[str, Path]) -> str | None:
    """The most specific module of ours that importing ``name`` loads (None: not ours)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def imported_names(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:  # relative: from the importer's package, one level up per extra dot
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        anchor = package[:len(package) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    for alias in node.names:
        yield f"{base}.{alias.name}"  # a submodule if it is one; ``ours`` falls back to ``base`` otherwise


def edges(known: dict[str, Path]) -> list[Edge]:
    found = []
    for importer, path in known.items():
        tree = parsing.parse(path.read_text(), str(path))
        for node in ast.walk(tree):  # every statement, at any depth: functions and TYPE_CHECKING blocks too
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in imported_names(node, importer, path.name == "__init__.py"):
                target = ours(name, known)
                if target is not None:
                    found.append(Edge(importer, target, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return found


@cache
def _read() -> tuple[tuple[str, ...], tuple[Edge, ...]]:
    known = modules()
    return tuple(known), tuple(edges(known))


# Read at collection (tests/parsing.py: CPython 3.11's race between threads' parses).
_read()


def graph() -> tuple[dict[str, set[str]], list[Edge]]:
    """Each module with the modules it imports (a fresh copy: callers may prune it), and the imports."""
    names, all_edges = _read()
    out: dict[str, set[str]] = {name: set() for name in names}
    for edge in all_edges:
        out[edge.importer].add(edge.imported)
    return out, list(all_edges)


def cycles(out: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's strongly connected components of more than one module, and modules importing themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(out[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in out[node]:
                found.append(frozenset(component))

    for node in sorted(out):
        if node not in index:
            visit(node)
    return found


def describe(cycle: frozenset[str], all_edges: list[Edge]) -> str:
    inside = sorted({(e.importer, e.imported, e.where) for e in all_edges
                     if e.importer in cycle and e.imported in cycle})
    return " <-> ".join(sorted(cycle)) + "".join(f"\n    {a} imports {b} ({where})" for a, b, where in inside)


def reachable(out: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module ``start`` loads, directly or not, each with the module that imports it on the way."""
    via: dict[str, str] = {}
    todo = [start]
    while todo:
        node = todo.pop()
        for nxt in sorted(out[node]):
            if nxt not in via and nxt != start:
                via[nxt] = node
                todo.append(nxt)
    return via


def chain(via: dict[str, str], start: str, end: str) -> str:
    path = [end]
    while path[-1] != start:
        path.append(via[path[-1]])
    return " -> ".join(reversed(path))


def test_the_graph_is_read_from_every_module() -> None:
    out, all_edges = graph()
    assert {"app.cli", "app.core.dispatch", "topics.catalog", "projections.bulk"} <= set(out)
    # an import inside a function counts (app/cli.py imports the simulator's command line lazily)
    assert "app.simulator.cli" in out["app.cli"]
    # `from package import submodule` is an import of the submodule
    assert any(e.importer == "app.simulator.stack" and e.imported == "app.simulator.check" for e in all_edges)


def test_no_import_circles() -> None:
    out, all_edges = graph()
    found = set(cycles(out))
    messages = [f"import circle: {describe(c, all_edges)}" for c in sorted(found, key=sorted)]
    assert not messages, "\n".join(messages)


def core_loads(forbidden: str) -> list[str]:
    """Each chain by which a module of app/core loads ``forbidden`` (or a module under it)."""
    out, _ = graph()
    wrong = []
    for module in sorted(m for m in out if m == "app.core" or m.startswith("app.core.")):
        via = reachable(out, module)
        wrong += [chain(via, module, target) for target in sorted(via)
                  if target == forbidden or target.startswith(forbidden + ".")]
    return wrong


@pytest.mark.parametrize("forbidden", ["app.gateways.registry", "app.simulator"])
def test_the_core_imports_neither_the_registry_nor_the_simulator(forbidden: str) -> None:
    wrong = core_loads(forbidden)
    assert not wrong, f"the pure core loads {forbidden}:\n" + "\n".join(wrong)


def test_the_registry_does_not_load_the_simulator() -> None:
    """The gateways' declarations are read by the ingest and the worker: they must not bring in the
    simulator (`import app.ingest` once loaded app.simulator.lifecycles through the registry)."""
    out, _ = graph()
    via = reachable(out, "app.gateways.registry")
    wrong = [chain(via, "app.gateways.registry", m) for m in sorted(via) if m.startswith("app.simulator")]
    assert not wrong, "\n".join(wrong)


def test_topics_import_nothing_from_app_or_projections() -> None:
    _, all_edges = graph()
    wrong = [f"{e.importer} imports {e.imported} ({e.where})" for e in all_edges
             if e.importer.split(".")[0] == "topics" and e.imported.split(".")[0] in ("app", "projections")]
    assert not wrong, "\n".join(wrong)


def test_a_circle_is_found_and_named() -> None:
    """The detector itself: a circle through three modules, a self-import, and a clean chain."""
    out = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert set(cycles(out)) == {frozenset({"a", "b", "c"}), frozenset({"d"})}
    assert cycles({"a": {"b"}, "b": set()}) == []
