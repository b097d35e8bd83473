"""Nothing in app/, projections/ or topics/ but app/settings.py (and app/settings_operator.py, its part
for commands run by hand) reads a setting from the environment.

The rule: a module may pass the whole environment on to a child process (``{**os.environ, ...}``,
``dict(os.environ)``, ``os.environ.items()`` or ``.copy()`` to build a child's environment), because
the child then builds its own Settings from it. It may not look a variable up: ``os.environ[...]``,
``os.environ.get``/``pop``/``setdefault``, ``"X" in os.environ``, ``os.getenv``, or ``environ`` and
``getenv`` imported by name. A setting goes into the table in app/settings.py instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests import parsing

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("app", "projections", "topics")
ALLOWED = {"app/settings.py", "app/settings_operator.py"}  # the second: settings of commands run by hand
# Still reading, being switched to Settings by whoever is restructuring the module (remove the entry
# once it reads Settings: test_pending_readers_still_read fails then, to say so).
PENDING: dict[str, str] = {}
PASSED_ON = {"items", "copy"}  # methods that hand over the whole environment


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in ("environ", "environb")
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _passed_on(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    if isinstance(parent, ast.Dict):  # {**os.environ, ...}: a `**` entry has no key
        return any(key is None and value is node for key, value in zip(parent.keys, parent.values, strict=True))
    if isinstance(parent, ast.Call):  # dict(os.environ)
        return node in parent.args
    if isinstance(parent, ast.keyword):  # Popen(..., env=os.environ)
        return isinstance(parents.get(parent), ast.Call)
    if isinstance(parent, ast.Attribute) and parent.attr in PASSED_ON:
        return isinstance(parents.get(parent), ast.Call)
    return False


def environ_reads(source: str) -> list[int]:
    """The lines of ``source`` that read the environment rather than pass it on."""
    tree = parsing.parse(source)
    parents = _parents(tree)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ("environ", "environb", "getenv", "getenvb") for alias in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr in ("getenv", "getenvb"):
            lines.append(node.lineno)
        elif _is_environ(node) and not _passed_on(node, parents):
            lines.append(getattr(node, "lineno", 0))
    return sorted(lines)


def test_no_module_but_the_settings_reads_the_environment() -> None:
    found = {}
    for folder in CHECKED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name not in ALLOWED | PENDING.keys() and (lines := environ_reads(path.read_text(encoding="utf-8"))):
                found[name] = lines
    assert not found, f"read os.environ (declare the setting on app/settings.py's Settings instead): {found}"



def test_pending_readers_still_read() -> None:
    done = [name for name in PENDING if not environ_reads((ROOT / name).read_text(encoding="utf-8"))]
    assert not done, f"{done} no longer read os.environ: remove them from PENDING"


def test_the_rule_tells_reading_from_passing_on() -> None:
    passing = """
import os, subprocess
env = {**os.environ, "ORDERLY_X": "1"}
child = {k: v for k, v in os.environ.items() if k != "ORDERLY_EFFECTS_URL"}
copied = dict(os.environ)
also = os.environ.copy()
subprocess.run(["true"], env=os.environ)
"""
    reading = """
import os
from os import getenv
a = os.environ["ORDERLY_X"]
b = os.environ.get("ORDERLY_X", "1")
c = os.getenv("ORDERLY_X")
d = "ORDERLY_X" in os.environ
e = os.environ.pop("ORDERLY_X")
"""
    assert environ_reads(passing) == []
    assert environ_reads(reading) == [3, 4, 5, 6, 7, 8]
