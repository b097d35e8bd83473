"""Which settings each process reads, from its code: what tests/unit/test_setting_uses.py holds
app/setting_uses.py's table to (and through it, the Helm chart's environments).

A process is a `cmd_<name>` of app/cli.py. What it reads is every ``settings.<field>`` (or
``<x>.settings.<field>``, ``s.<field>``) in the modules its command imports, transitively within
app/, topics/ and projections/, and in the start-up it shares with the others when it calls
``_process`` (``use_logging``); a property of :class:`~app.settings.Settings` stands for the fields it reads.
An upper bound (a module imported reads for all its callers), never a guess: a setting that no
module of the process names is one the process does not read.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from app.settings import TABLE, Settings
from tests import parsing

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "topics", "projections")
FIELDS = frozenset(row.field for row in TABLE)
SHARED_START = ("_process", "use_logging")  # app/cli.py: what a command that runs `_process` runs first


def _file(module: str) -> Path | None:
    for path in (ROOT / f"{module.replace('.', '/')}.py", ROOT / module.replace(".", "/") / "__init__.py"):
        if path.is_file():
            return path
    return None


@cache
def _tree(path: Path) -> ast.Module:
    return parsing.parse(path.read_text(encoding="utf-8"))


def _imports(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The modules ``node`` imports (with each name of a from-import, which may be a module)."""
    found: list[str] = []
    for child in ast.walk(node):
        if isinstance(child, ast.Import):
            found += [alias.name for alias in child.names]
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (child.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            found += [base, *(f"{base}.{alias.name}" for alias in child.names)]
    return [name for name in found if name.split(".")[0] in PACKAGES]


def closure(modules: list[str]) -> set[str]:
    """``modules`` and every module of Orderly's packages they import, transitively (parents too)."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        path = _file(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        todo += _imports(_tree(path), module, path.name == "__init__.py")
        todo += [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]
    return seen


def _settings_names(node: ast.AST) -> set[str]:
    """Attributes read off something named like the settings: settings.x, self.settings.x, s.x."""
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Attribute):
            owner = child.value
            label = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if label.endswith("settings") or label == "s":
                names.add(child.attr)
        # a setting an adapter names for the ingest to read by name (adyen's BASIC_AUTH_SETTING)
        elif isinstance(child, ast.Assign) and isinstance(child.value, ast.Constant) and any(
                isinstance(t, ast.Name) and t.id.endswith("_SETTING") for t in child.targets):
            names.add(str(child.value.value))
    return names


def _properties() -> dict[str, set[str]]:
    """Each property of Settings and the fields its body reads (self.<field>)."""
    source = _tree(ROOT / "app" / "settings.py")
    klass = next(n for n in source.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    found: dict[str, set[str]] = {}
    for item in klass.body:
        if isinstance(item, ast.FunctionDef) and isinstance(getattr(Settings, item.name, None), property):
            found[item.name] = {c.attr for c in ast.walk(item) if isinstance(c, ast.Attribute)
                                and isinstance(c.value, ast.Name) and c.value.id == "self" and c.attr in FIELDS}
    return found


def _cli_functions(*names: str) -> list[ast.FunctionDef]:
    tree = _tree(ROOT / "app" / "cli.py")
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert len(wanted) == len(names), f"app/cli.py has no {set(names) - {n.name for n in wanted}}"
    return wanted


def fields_read(process: str) -> frozenset[str]:
    """The Settings fields ``process`` (`orderly <process>`) reads."""
    command = _cli_functions(f"cmd_{process}")[0]
    calls = {c.func.id for c in ast.walk(command) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    functions = [command, *(_cli_functions(*SHARED_START) if "_process" in calls else [])]
    modules = closure([m for f in functions for m in _imports(f, "app.cli", False)])
    names = set().union(*(_settings_names(f) for f in functions))
    for module in modules:
        path = _file(module)
        assert path is not None
        names |= _settings_names(_tree(path))
    properties = _properties()
    for name in list(names):
        names |= properties.get(name, set())
    return frozenset(names & FIELDS)
