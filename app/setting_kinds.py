"""How a setting's environment text becomes a typed value and back: the kinds of value and the row
of the settings table (configuration layer; the table itself is in app/settings.py)."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from app.settings import Settings

T = TypeVar("T")


class SettingsError(ValueError):
    """A setting is missing or unusable; the message names the variable, the value and what is accepted."""


class Kind(Protocol[T]):
    """How a variable's text becomes a value and back; ``parse`` raises ValueError saying why not."""

    @property
    def accepts(self) -> str: ...

    def parse(self, raw: str) -> T: ...

    def render(self, value: T) -> str: ...


@dataclass(frozen=True)
class Text:
    pattern: str = r".*\S.*"  # not blank
    what: str = "non-blank text"

    @property
    def accepts(self) -> str:
        return self.what

    def parse(self, raw: str) -> str:
        if not re.fullmatch(self.pattern, raw, re.DOTALL):
            raise ValueError(f"not {self.what}")
        return raw

    def render(self, value: str) -> str:
        return value


@dataclass(frozen=True)
class Integer:
    minimum: int

    @property
    def accepts(self) -> str:
        return f"an integer ≥ {self.minimum}"

    def parse(self, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError("not an integer") from None
        if value < self.minimum:
            raise ValueError(f"below {self.minimum}")
        return value

    def render(self, value: int) -> str:
        return str(value)


@dataclass(frozen=True)
class Number:
    """A finite number above zero: a duration or a rate, never "off" (0) or forever (inf)."""

    @property
    def accepts(self) -> str:
        return "a finite number > 0"

    def parse(self, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError("not a number") from None
        if not value > 0 or value == math.inf:  # NaN compares false to everything
            raise ValueError("not a finite number above 0")
        return value

    def render(self, value: float) -> str:
        text = repr(value)  # repr round-trips exactly; "30" reads better than "30.0"
        return text.removesuffix(".0")


@dataclass(frozen=True)
class Millis:
    """Whole milliseconds in the environment, seconds in Settings."""

    @property
    def accepts(self) -> str:
        return "whole milliseconds ≥ 0"

    def parse(self, raw: str) -> float:
        return Integer(minimum=0).parse(raw) / 1000

    def render(self, value: float) -> str:
        return str(round(value * 1000))


@dataclass(frozen=True)
class Choice:
    choices: tuple[str, ...]

    @property
    def accepts(self) -> str:
        return "one of " + ", ".join(self.choices)

    def parse(self, raw: str) -> str:
        if raw.lower() not in self.choices:
            raise ValueError("not one of them")
        return raw.lower()

    def render(self, value: str) -> str:
        return value


@dataclass(frozen=True)
class Flag:
    @property
    def accepts(self) -> str:
        return "1, true, yes, on or 0, false, no, off"

    def parse(self, raw: str) -> bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError("not a yes or a no")

    def render(self, value: bool) -> str:
        return "1" if value else "0"


@dataclass(frozen=True)
class Secrets:
    """Signing secrets, newest first: several while a gateway's secret is being rotated."""

    @property
    def accepts(self) -> str:
        return "secrets separated by commas, none empty"

    def parse(self, raw: str) -> tuple[str, ...]:
        parts = tuple(p.strip() for p in raw.split(","))
        # An empty HMAC key is forgeable by anyone, so an empty entry is an error, not "no check".
        if any(not p for p in parts):
            raise ValueError("an empty secret (an empty HMAC key is forgeable)")
        return parts

    def render(self, value: tuple[str, ...]) -> str:
        return ",".join(value)


@dataclass(frozen=True)
class Directory:
    @property
    def accepts(self) -> str:
        return "a directory path"

    def parse(self, raw: str) -> Path:
        return Path(raw)

    def render(self, value: Path) -> str:
        return str(value)


@dataclass(frozen=True)
class Maybe(Generic[T]):
    """A setting that may be off: unset (or empty) is None, and None is passed on as empty."""

    kind: Kind[T]

    @property
    def accepts(self) -> str:
        return f"{self.kind.accepts}, or unset"

    def parse(self, raw: str) -> T | None:
        return self.kind.parse(raw)

    def render(self, value: T | None) -> str:
        return "" if value is None else self.kind.render(value)


class Required(enum.Enum):
    REQUIRED = "required"


REQUIRED = Required.REQUIRED


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One row of the table: where a Settings attribute comes from, what it accepts, what it means."""

    field: str  # the Settings attribute (with ``key``: the entry of that mapping)
    env: str
    kind: Kind[T]
    default: T | Required  # the value when the variable is unset or empty
    description: str
    dev: str | None = None  # the environment text `orderly dev` and `orderly demo` use when unset
    key: str | None = None
    is_secret: bool = False  # its value is never written into a message (logs keep messages)

    def read(self, env: Mapping[str, str]) -> T:
        raw = env.get(self.env, "")
        if raw == "":  # an empty variable counts as unset, so "" can pass on "off" (Maybe)
            if self.default is REQUIRED:
                raise SettingsError(f"{self.env} is not set or is empty: {self.description}; it takes "
                                    f"{self.kind.accepts} (see docs/configuration.md)")
            return self.default
        try:
            return self.kind.parse(raw)
        except ValueError as exc:
            shown = f"{self.env} (value withheld)" if self.is_secret else f"{self.env}={raw!r}"
            raise SettingsError(f"{shown}: {exc}; it takes {self.kind.accepts}") from None

    def value(self, settings: Settings) -> T:
        found = getattr(settings, self.field)
        return found if self.key is None else found[self.key]  # type: ignore[no-any-return]

    def text_default(self) -> str:
        if self.default is REQUIRED:
            return "required"
        return self.kind.render(self.default) or "unset"
