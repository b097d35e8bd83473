"""The one door to each library whose internals Orderly relies on (seam layer).

Every read or write of a private attribute, every subclass and every patch of Faust, mode, aiokafka
and aiohttp lives in the module of this package named after the library, next to the upstream
behaviour it relies on; the rest of the code speaks to the seams' typed functions and classes.
Those internals are only known to hold on the exact versions below: ``check_versions`` refuses any
other at start-up with one clear line, and tests/unit/test_seams_*.py fail loudly when upstream
changes under a seam.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# The distributions whose internals the seams touch, at the versions they were read and tested on.
# pyproject.toml pins the same versions (tests/unit/test_seams.py checks that the two agree).
PINNED: dict[str, str] = {
    "faust-streaming": "0.15.3",
    "mode-streaming": "0.7.1",
    "aiokafka": "0.14.0",
    "aiohttp": "3.14.5",
}


class UnsupportedVersion(RuntimeError):
    """An installed library is not the version the seams were written against."""


def mismatches() -> list[str]:
    """One line per pinned distribution whose installed version differs (or that is missing)."""
    wrong = []
    for name, wanted in PINNED.items():
        try:
            found = version(name)
        except PackageNotFoundError:
            found = "not installed"
        if found != wanted:
            wrong.append(f"{name} {found} (Orderly needs exactly {wanted})")
    return wrong


def check_versions() -> None:
    """Refuse to start on library versions the seams were not written against."""
    wrong = mismatches()
    if wrong:
        raise UnsupportedVersion(
            "unsupported library versions: " + "; ".join(wrong)
            + ". Install Orderly's pinned dependencies (pip install -e . or make setup); "
            "see docs/production.md#library-versions.")
