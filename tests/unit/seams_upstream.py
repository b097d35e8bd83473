"""Helpers of the seam tests: fingerprints of upstream source and the members a seam relies on."""

from __future__ import annotations

import hashlib
import inspect
from typing import Any


def fingerprint(obj: Any) -> str:
    """The first 16 hex digits of the SHA-256 of ``obj``'s source."""
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


def parameters(obj: Any) -> list[str]:
    return list(inspect.signature(obj).parameters)


def assigns(cls: type, method: str, attribute: str) -> bool:
    """Whether ``cls.method``'s source assigns ``self.attribute``."""
    source = inspect.getsource(getattr(cls, method))
    return f"self.{attribute} =" in source or f"self.{attribute}:" in source


def changed(expected: dict[str, str], found: dict[str, str], library: str) -> str:
    lines = [f"{name}: {found[name]} (read at {want})" for name, want in expected.items() if found[name] != want]
    return (f"{library} changed under its seam: read these again against app/seams and update the seam "
            "and these fingerprints:\n" + "\n".join(lines))
