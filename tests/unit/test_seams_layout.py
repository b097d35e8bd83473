"""One door per library: outside app/seams, no module reaches into Faust, mode or aiokafka.

Walks the AST of every module of app/ outside app/seams and fails on: an import of a module of
those libraries that is not their public API; a class that subclasses one of their classes; and, in
a module that imports one of them, any read or write of a private attribute (``x._name``, or
``getattr(x, "_name")``) of an object other than the module's own ``self``/``cls``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests import parsing

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = ("faust", "mode", "aiokafka")
# The libraries' public API: their packages' top level, Faust's type interfaces, aiokafka's
# admin client, errors, structs, TLS helper, and the metadata probe (a connection and the protocol's
# MetadataRequest, which app/kafka_client.py and app/ingest/appender.py use as aiokafka documents them).
PUBLIC = {"faust", "faust.types", "mode", "aiokafka", "aiokafka.admin", "aiokafka.errors", "aiokafka.structs",
          "aiokafka.helpers", "aiokafka.cluster", "aiokafka.conn", "aiokafka.protocol.metadata"}
PUBLIC_PREFIXES = ("faust.types.",)
# Classes the libraries document as interfaces to subclass.
SUBCLASSABLE = {"aiokafka.ConsumerRebalanceListener"}
ALLOWED_PRIVATE = {"os._exit"}  # the standard library's documented immediate exit


def modules() -> list[Path]:
    return sorted(path for path in (ROOT / "app").rglob("*.py") if "seams" not in path.relative_to(ROOT).parts)


def library_of(module: str) -> str | None:
    root = module.split(".")[0]
    return root if root in LIBRARIES else None


def is_public(module: str) -> bool:
    return module in PUBLIC or module.startswith(PUBLIC_PREFIXES)


def offences(tree: ast.Module, name: str) -> list[str]:
    found: list[str] = []
    imported: dict[str, str] = {}  # local name -> the library object or module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if library_of(alias.name):
                    imported[(alias.asname or alias.name).split(".")[0]] = alias.name.split(".")[0]
                    if not is_public(alias.name):
                        found.append(f"{name}:{node.lineno} imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and library_of(node.module):
            if not is_public(node.module):
                found.append(f"{name}:{node.lineno} imports {node.module}")
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                if alias.name.startswith("_"):
                    found.append(f"{name}:{node.lineno} imports {node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                root = base
                while isinstance(root, (ast.Attribute, ast.Subscript)):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in imported:
                    spelled = ast.unparse(base).split("[")[0]
                    qualified = imported[root.id] + spelled[len(root.id):]
                    if qualified not in SUBCLASSABLE:
                        found.append(f"{name}:{node.lineno} class {node.name} subclasses {qualified}")
        if not imported:
            continue
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) \
                    and ast.unparse(node) not in ALLOWED_PRIVATE:
                found.append(f"{name}:{node.lineno} reads or writes {ast.unparse(node)}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_")):
            found.append(f"{name}:{node.lineno} reads or writes {ast.unparse(node)}")
    return found


# Parsed as the tests are collected (tests/parsing.py: CPython 3.11's race between threads' parses).
TREES = {str(path.relative_to(ROOT)): parsing.parse(path.read_text()) for path in modules()}


def test_no_module_outside_the_seams_reaches_into_faust_mode_or_aiokafka() -> None:
    assert len(TREES) > 50  # the walk sees app/
    found = [offence for name, tree in TREES.items() for offence in offences(tree, name)]
    assert found == [], "go through app/seams (one door per library):\n" + "\n".join(found)


OFFENDING = parsing.parse('''
import faust
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.producer import sender
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.streams import _current_event
import os

class App(faust.App): pass
class Consumer(faust_aiokafka.Consumer): pass
class Listener(ConsumerRebalanceListener): pass
class Mine:
    def f(self, consumer: AIOKafkaConsumer) -> None:
        self._ours = consumer._fetcher
        getattr(consumer, "_coordinator", None)
        os._exit(1)
''')
HARMLESS = parsing.parse("import aiohttp\nrunner._site = 1\n")


def test_the_walk_finds_each_kind_of_offence() -> None:
    assert offences(OFFENDING, "m.py") == [
        "m.py:4 imports aiokafka.producer", "m.py:5 imports faust.transport.drivers",
        "m.py:6 imports faust.streams", "m.py:6 imports faust.streams._current_event",
        "m.py:9 class App subclasses faust.App",
        "m.py:10 class Consumer subclasses faust.transport.drivers.aiokafka.Consumer",
        "m.py:14 reads or writes consumer._fetcher", "m.py:15 reads or writes getattr(consumer, '_coordinator', None)"]


def test_a_module_of_no_such_library_is_not_held_to_the_private_attribute_rule() -> None:
    assert offences(HARMLESS, "m.py") == []
