"""Test support: a pytest plugin for mutmut's runs only (`make mutation`, docs/testing.md).

Loaded by pyproject.toml [tool.mutmut] pytest_add_cli_args, never by the suite itself. It does two
things:
- mutmut 3.7 reads `item._nodeid`, which pytest 9 no longer has (mutmut 3.8 reads `item.nodeid` but
  needs click >= 8.4.2, which Faust's click < 8.4 excludes): the attribute is given back.
- Hypothesis runs derandomized, without its example database and without its deadline, so that
  whether a mutant is killed is the same on every run: an example that killed one mutant is not
  replayed against the next, and a test slowed by a busy CPU (not by the mutant) does not fail on
  time and count the mutant as killed.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

if not hasattr(pytest.Item, "_nodeid"):
    pytest.Item._nodeid = property(lambda self: self.nodeid)  # type: ignore[attr-defined]

settings.register_profile("mutation", derandomize=True, database=None, deadline=None)
settings.load_profile("mutation")
