"""requirements.lock, which `make setup` installs from with --require-hashes (issue #45, item 5), holds
every requirement of pyproject.toml (its dependencies and the dev extra) and requirements-build.in at
a version each allows, every package with its hashes, and the distribution of every third-party module
that app/, tests/ and bench/ import. Adding a dependency without regenerating the lock fails here
(the command is in requirements-build.in)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests import parsing

ROOT = Path(__file__).resolve().parents[2]
ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def locked() -> dict[str, tuple[Version, int]]:
    """Each locked package: its version and how many hashes it carries."""
    found: dict[str, tuple[Version, int]] = {}
    name = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if match := ENTRY.match(line):
            name = canonicalize_name(match[1])
            found[name] = (Version(match[2]), 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes = found[name]
            found[name] = (version, hashes + 1)
    return found


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    build = [line.split("#")[0].strip() for line in (ROOT / "requirements-build.in").read_text().splitlines()]
    return [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"],
                                     *filter(None, build)]]


def test_every_requirement_is_locked_at_a_version_it_allows_with_hashes() -> None:
    lock = locked()
    assert len(lock) > 50
    for req in requirements():
        name = canonicalize_name(req.name)
        assert name in lock, f"{req} is not in requirements.lock: regenerate it (requirements-build.in)"
        assert req.specifier.contains(lock[name][0], prereleases=True), (str(req), str(lock[name][0]))
    assert all(hashes for _, hashes in lock.values()), [n for n, (_, h) in lock.items() if not h]


def test_every_module_imported_comes_from_a_locked_package() -> None:
    lock = locked()
    modules: set[str] = set()
    for folder in ("app", "tests", "bench", "topics", "projections"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(parsing.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    modules |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - {"app", "tests", "bench", "topics", "projections"}
    distributions = packages_distributions()
    unlocked = {m: distributions.get(m) for m in third_party
                if not any(canonicalize_name(d) in lock for d in distributions.get(m, []))}
    assert not unlocked, f"imported, but no locked package provides them: {unlocked}"


def test_make_setup_installs_from_the_lock_with_hashes() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet --require-hashes -r requirements.lock" in makefile
    assert "pip install --quiet --no-deps --no-build-isolation -e ." in makefile
    assert "-e '.[dev]'" not in makefile  # the unlocked resolution it replaced
