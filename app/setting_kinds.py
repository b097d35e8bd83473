"""How a setting's environment text becomes a typed value and back: the kinds of value, the secret
that never prints, and the descriptor that declares a setting on the Settings class (configuration
layer; the settings themselves are declared in app/settings.py)."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, overload

T = TypeVar("T")
C = TypeVar("C", bound=str)  # a Literal of the choices
MOST_SECRET_FILE = 64 * 1024  # characters a <NAME>_FILE may hold: far more than any secret


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

    minimum: int = 0
    off: bool = False  # `0` accepted too (the feature off), below the minimum

    @property
    def accepts(self) -> str:
        return ("`0` (off) or " if self.off else "") + f"whole milliseconds ≥ {self.minimum}"

    def parse(self, raw: str) -> float:
        return 0.0 if self.off and raw.strip() == "0" else Integer(minimum=self.minimum).parse(raw) / 1000

    def render(self, value: float) -> str:
        return str(round(value * 1000))


@dataclass(frozen=True)
class Choice(Generic[C]):
    """One of ``choices``, in any case; the value is the choice itself, typed as its Literal
    (``Choice[Store](get_args(Store))``)."""

    choices: tuple[C, ...]

    @property
    def accepts(self) -> str:
        return "one of " + ", ".join(self.choices)

    def parse(self, raw: str) -> C:
        for choice in self.choices:
            if choice == raw.lower():
                return choice
        raise ValueError("not one of them")

    def render(self, value: C) -> str:
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
class Names:
    """Several of the names ``known()`` gives, comma-separated, each once (the enabled gateways).
    ``known`` is asked when the text is read, so a name registered later (a test's toy gateway)
    counts; the value keeps ``known``'s order, so that two spellings of one choice read the same."""

    known: Callable[[], Iterable[str]]
    what: str = "name"

    @property
    def accepts(self) -> str:
        return f"{self.what}s separated by commas, each once, of " + ", ".join(self.known())

    def parse(self, raw: str) -> tuple[str, ...]:
        parts = [p.strip() for p in raw.split(",")]
        known = tuple(self.known())
        if unknown := [p for p in parts if p not in known]:
            raise ValueError(f"unknown {self.what} {', '.join(repr(p) for p in unknown)}")
        if len(set(parts)) < len(parts):
            raise ValueError(f"a {self.what} named twice")
        return tuple(name for name in known if name in parts)

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


class Secret(Generic[T]):
    """A value that never prints: its repr and str are masked, so a log line, a traceback's locals or
    a Settings repr cannot show it; :meth:`reveal` hands it to the one place that needs it."""

    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        self._value = value

    def reveal(self) -> T:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        # an f-string meant the value (a header, a DSN) and would silently get the mask: refused instead
        raise TypeError("a Secret is not formatted: reveal() it where the value is meant")

    def __bool__(self) -> bool:
        # whether a value is there (no secrets at all is falsy, as the value is): the checks that
        # refuse a missing token or a gateway without secrets ask exactly this
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and bool(self._value == other._value)

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[type[Secret[T]], tuple[T]]:
        return (Secret, (self._value,))


@dataclass(frozen=True)
class Hidden(Generic[T]):
    """A secret of ``kind``: parsed and rendered as that kind, held as a :class:`Secret`; a refused
    value is withheld from the message."""

    kind: Kind[T]

    @property
    def accepts(self) -> str:
        return self.kind.accepts

    def parse(self, raw: str) -> Secret[T]:
        return Secret(self.kind.parse(raw))

    def render(self, value: Secret[T]) -> str:
        return self.kind.render(value.reveal())


def _hides(kind: Kind[Any]) -> bool:
    return isinstance(kind, Hidden) or (isinstance(kind, Maybe) and _hides(kind.kind))


class Required(enum.Enum):
    REQUIRED = "required"


REQUIRED = Required.REQUIRED


class Setting(Generic[T]):
    """One setting, declared as an attribute of the Settings class: its variable, what it accepts,
    its default, what it means. The attribute's name is the field; on an instance it is the value
    (held in the instance's ``__dict__``, which a non-data descriptor lets shadow it)."""

    def __init__(self, env: str, kind: Kind[T], default: T | Required, description: str, *,
                 dev: str | None = None) -> None:
        self.env = env
        self.kind = kind
        self.default = default  # the value when the variable is unset or empty
        self.description = description
        self.dev = dev  # the environment text `orderly dev` and `orderly demo` use when unset
        self.field = ""  # the Settings attribute (with ``key``: the entry of that mapping)
        self.key: str | None = None
        self.is_secret = _hides(kind)  # its value is never written into a message (logs keep messages)

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = name

    @overload
    def __get__(self, instance: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, instance: object, owner: type) -> T: ...

    def __get__(self, instance: object | None, owner: type) -> Setting[T] | T:
        if instance is None:
            return self
        raise AttributeError(f"{self.field} was not read: build settings with Settings.from_env, with this process's "
                             "uses (app/setting_uses.py) naming it")

    def __repr__(self) -> str:
        return f"Setting({self.env})"

    @property
    def page(self) -> str:
        """Where docs/configuration.md explains it (its row's anchor), for the end of a refusal."""
        return f"docs/configuration.md#{self.env.lower()}"

    def text(self, env: Mapping[str, str]) -> str:
        """The variable's text; a secret's may come from the file ``<NAME>_FILE`` names (a mounted
        Secret), its one trailing newline dropped, as an editor or ``echo`` leaves one."""
        raw = env.get(self.env, "")
        path = env.get(f"{self.env}_FILE", "") if self.is_secret else ""
        if not path:
            return raw
        if raw:
            raise SettingsError(f"{self.env} and {self.env}_FILE are both set: keep one ({self.page})")
        try:
            with open(path, encoding="utf-8") as file:
                content = file.read(MOST_SECRET_FILE + 1)  # a wrong path (/dev/zero, a dump) is not read whole
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
            raise SettingsError(f"{self.env}_FILE={path!r}: {reason.lower()}; it takes the path of a readable file "
                                f"holding {self.env} ({self.page})") from None
        if len(content) > MOST_SECRET_FILE:
            raise SettingsError(f"{self.env}_FILE={path!r}: larger than 64 KiB, so no secret; it takes the path of a "
                                f"readable file holding {self.env} ({self.page})")
        return content.removesuffix("\n").removesuffix("\r")

    def read(self, env: Mapping[str, str]) -> T:
        raw = self.text(env)
        if raw == "":  # an empty variable counts as unset, so "" can pass on "off" (Maybe)
            if self.default is REQUIRED:
                raise SettingsError(f"{self.env} is not set or is empty: {self.description}; it takes "
                                    f"{self.kind.accepts} ({self.page})")
            return self.default
        try:
            return self.kind.parse(raw)
        except ValueError as exc:
            shown = f"{self.env} (value withheld)" if self.is_secret else f"{self.env}={raw!r}"
            raise SettingsError(f"{shown}: {exc}; it takes {self.kind.accepts} ({self.page})") from None

    def value(self, settings: object) -> T:
        # a row not read (a disabled gateway's secret, a required setting the process does not use) is None
        found: Any = vars(settings).get(self.field)
        value: T = found if self.key is None or found is None else found.get(self.key)
        return value

    def text_default(self) -> str:
        if self.default is REQUIRED:
            return "required"
        return self.kind.render(self.default) or "unset"


class Keyed(Generic[T]):
    """Several settings of one kind gathered in one mapping attribute, one per key (a gateway's
    secrets: ``settings.secrets["pg"]``)."""

    def __init__(self, rows: Mapping[str, Setting[T]]) -> None:
        self.rows = tuple(rows.values())
        for key, row in rows.items():
            row.key = key

    def __set_name__(self, owner: type, name: str) -> None:
        for row in self.rows:
            row.field = name

    @overload
    def __get__(self, instance: None, owner: type) -> Keyed[T]: ...

    @overload
    def __get__(self, instance: object, owner: type) -> Mapping[str, T]: ...

    def __get__(self, instance: object | None, owner: type) -> Keyed[T] | Mapping[str, T]:
        if instance is None:
            return self
        raise AttributeError("secrets were not read: build settings with Settings.from_env")
