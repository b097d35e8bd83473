"""``ast.parse`` for the tests that read the code, past a CPython 3.11.7 race.

Up to 3.11.7 the AST constructor keeps its recursion depth in state shared by the whole interpreter
(Python-ast.c, ``PyAST_mod2obj``), so another parse while this one builds its tree leaves the depth
off, and this one fails with ``SystemError: AST constructor recursion depth mismatch (before=…,
after=…)`` (python/cpython#106905, fixed in 3.11.8 and 3.12.2 by #113035; the machines here run
3.11.7). The other parse can be in another thread, the garbage collector having let the GIL go
while this tree is built, or nested in this one: a finalizer that logs (an unclosed session, a task
destroyed pending) formats a traceback, which in 3.11 parses each source line to place its carets.
Seen in CI in a unit test that ran after the end-to-end tests (``before=120, after=139``), and
reproduced here with two threads parsing beside finalizers. The parse is tried again, a few times:
the other is over by then.

Our own tests' parses are not the only ones: Hypothesis parses a test module's source to describe a
lambda in a strategy (its repr, written when a filter retries a draw), and pytest parses each test
module it rewrites. A unit test failed in CI so (``SystemError`` in Hypothesis's lambda
description, then ``FlakyFailure``), so ``install()``, called by tests/conftest.py, makes every
``ast.parse`` of the test process this one.
"""

from __future__ import annotations

import ast
from typing import Any

TRIES = 5
RACE = "AST constructor recursion depth mismatch"

_parse = ast.parse  # the interpreter's own, kept before install() replaces ast.parse


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """A module's tree, the parse tried again when it lost the race."""
    tree = any_parse(source, filename)
    assert isinstance(tree, ast.Module)
    return tree


def any_parse(source: str | bytes, filename: str = "<unknown>", *args: Any, **kwargs: Any) -> Any:
    """``ast.parse``, with its signature, tried again when it lost the race."""
    for _ in range(TRIES - 1):
        try:
            return _parse(source, filename, *args, **kwargs)
        except SystemError as exc:
            if RACE not in str(exc):
                raise
    return _parse(source, filename, *args, **kwargs)


def install() -> None:
    """Every ``ast.parse`` of this process (Hypothesis's, pytest's, the traceback module's) is ``any_parse``."""
    setattr(ast, "parse", any_parse)  # noqa: B010  (mypy refuses a plain function for the overloaded name)
