"""No module in app/, topics/ or projections/ over 400 lines, no function or method over 80.

A module is counted by its lines (the file's length); a function from its ``def`` line to its last
line (decorators not counted, nested functions counted in their outer function too). The limits are
the size rule of issue #43: a reader should find a module's purpose without scrolling far, and a
function's steps on one screen.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests import parsing

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("app", "topics", "projections")
MODULE_LINES = 400
FUNCTION_LINES = 80

def modules() -> list[Path]:
    return sorted(path for folder in CHECKED for path in (ROOT / folder).rglob("*.py"))


def violations(path: Path, root: Path = ROOT) -> list[str]:
    """What in ``path`` is over the limits, each as ``path[:line] what``."""
    source = path.read_text(encoding="utf-8")
    name = path.relative_to(root).as_posix()
    found = []
    lines = len(source.splitlines())
    if lines > MODULE_LINES:
        found.append(f"{name}: module of {lines} lines (at most {MODULE_LINES})")
    for node in ast.walk(parsing.parse(source, name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LINES:
                found.append(f"{name}:{node.lineno}: function {node.name} of {length} lines"
                             f" (at most {FUNCTION_LINES})")
    return found


# Every module read at collection, not late in the suite (see tests/unit/test_import_graph.py's _read).
FOUND = {path: violations(path) for path in modules()}


def test_the_walk_finds_the_modules() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in modules()}
    assert {"app/cli.py", "topics/__init__.py", "projections/migrate.py"} <= names


def test_no_module_or_function_over_the_limits() -> None:
    found = [line for path in modules() for line in FOUND[path]]
    assert not found, "over the size limits:\n" + "\n".join(found)


def test_the_counts(tmp_path: Path) -> None:
    """The counts themselves: a module of 401 lines and a function of 81 are each named once."""
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    module = tmp_path / "m.py"
    module.write_text(f"def long():\n{body}\n    return 0\n" + "\n" * (401 - 81 - 1) + "y = 1\n",
                      encoding="utf-8")
    assert violations(module, tmp_path) == ["m.py: module of 401 lines (at most 400)",
                     "m.py:1: function long of 81 lines (at most 80)"]
