"""A gateway lives in its registry line and its own modules (DESIGN.md §2.7): nothing else in app/,
topics/ or projections/ quotes a registered gateway's name. Its own modules are
app/gateways/<name>.py, app/core/<name>.py, app/simulator/<name>*.py, app/gateways/registry.py and
the modules its registry line names by path (``routes``, ``simulator``); its migration is SQL and
the tests are free to name it. Quoting is a string that is the name, starts with ``<name>:`` (a
resource key or a dedupe key, f-strings too) or holds ``'<name>'`` (SQL); a docstring may mention it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from app.gateways import registry
from tests import parsing

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("app", "topics", "projections")
# Files that still name gateways, each with why; the test below fails once one no longer does, so
# that the list only shrinks. Empty: no exception.
STILL_NAMING: dict[str, str] = {}


def quoted(source: str, names: list[str]) -> Iterator[tuple[int, str, str]]:
    """(line, name, string) of each string of ``source`` that quotes one of ``names``."""
    tree = parsing.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            for name in names:
                if node.value == name or node.value.startswith(f"{name}:") or f"'{name}'" in node.value:
                    yield node.lineno, name, node.value


def own_files(gateway: registry.Gateway) -> set[str]:
    name = gateway.name
    files = {f"app/gateways/{name}.py", f"app/core/{name}.py", "app/gateways/registry.py"}
    files |= {str(p.relative_to(ROOT)) for p in (ROOT / "app" / "simulator").glob(f"{name}*.py")}
    files |= {module.replace(".", "/") + ".py" for module in (gateway.routes, gateway.simulator) if module}
    return files


def offences() -> dict[str, list[str]]:
    """Each scanned file with the names it quotes outside their gateway's own modules."""
    gateways = list(registry.GATEWAYS.values())
    found: dict[str, list[str]] = {}
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            names = [g.name for g in gateways if relative not in own_files(g)]
            for line, name, text in quoted(path.read_text(), names):
                found.setdefault(relative, []).append(f"{relative}:{line}: {name!r} in {text[:80]!r}")
    return found


def test_no_gateway_name_is_quoted_outside_its_own_modules() -> None:
    wrong = [line for path, lines in offences().items() if path not in STILL_NAMING for line in lines]
    assert not wrong, ("a gateway is named outside its registry line and its own modules; declare what it "
                       "needs on its registry line (docs/adding-a-gateway.md):\n" + "\n".join(wrong))


def test_each_exception_still_names_a_gateway() -> None:
    found = offences()
    stale = [path for path in STILL_NAMING if path not in found]
    assert not stale, f"{stale} name no gateway any more: take them off STILL_NAMING"


def test_the_rule_sees_each_way_of_quoting_a_name() -> None:
    source = '''
"""pg is mentioned in a docstring: fine."""
a = "pg"
b = f"pg:{resource}"
c = "SELECT 1 FROM pg_sequence_gaps WHERE merchant = 'pg'"
d = {"card": 1}
e = "pg_deposits"  # a table of pg's: its own name, not the gateway's
f = "a card payment"
'''
    assert sorted((line, name) for line, name, _ in quoted(source, ["pg", "card"])) == [(3, "pg"), (4, "pg"), (5, "pg"),
                                                                                 (6, "card")]


def test_a_gateways_own_modules_include_what_its_line_names_by_path() -> None:
    pg = registry.find("pg")
    assert pg is not None
    assert {"app/ingest/correlations.py", "app/simulator/pg.py", "app/core/pg.py"} <= own_files(pg)
    assert "app/simulator/paymos.py" not in own_files(pg)
