"""Kinds of setting that name a place — Kafka's host:port list, a URL, a PostgreSQL DSN, a port, a
file — checked in form without connecting (configuration layer; the other kinds are in
app/setting_kinds.py, whose ``Kind`` protocol these follow).

Each ``parse`` raises ValueError saying what is wrong with the text, so that a bad value stops a
process with one line naming its variable (app/settings.py) instead of a traceback from the
library that would have been handed it later (aiokafka, asyncpg, aiohttp).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

HIGHEST_PORT = 65535
# a host name (RFC 1123 labels, and '_', which Docker's service names may hold), an IPv4 address, or an
# IPv6 address in brackets
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*"
                   r"|\[[0-9A-Fa-f:.]+\]")


def port_number(text: str, where: str) -> int:
    """``text`` as a port 1-65535; ValueError naming ``where`` otherwise."""
    if not text.isdigit():
        raise ValueError(f"the port of {where} is not a number")
    port = int(text)
    if not 1 <= port <= HIGHEST_PORT:
        raise ValueError(f"the port of {where} is {port}, outside 1-{HIGHEST_PORT}")
    return port


@dataclass(frozen=True)
class HostPorts:
    """Kafka's bootstrap servers: ``host:port`` entries separated by commas, no scheme."""

    @property
    def accepts(self) -> str:
        return "host:port, comma-separated (e.g. `kafka-1:9092,kafka-2:9092`, no scheme)"

    def parse(self, raw: str) -> str:
        for entry in (part.strip() for part in raw.split(",")):
            if "://" in entry:
                raise ValueError(f"{entry!r} is a URL: give host:port without a scheme")
            host, colon, port = entry.rpartition(":")
            if not colon or not host:
                raise ValueError(f"{entry!r} is not host:port")
            if not _HOST.fullmatch(host):
                raise ValueError(f"{host!r} in {entry!r} is not a host name or address")
            port_number(port, repr(entry))
        return raw

    def render(self, value: str) -> str:
        return value


@dataclass(frozen=True)
class Url:
    """An http:// or https:// URL with a host (and a port 1-65535 if it names one)."""

    what: str = "an http:// or https:// URL"

    @property
    def accepts(self) -> str:
        return self.what

    def parse(self, raw: str) -> str:
        try:
            parts = urlsplit(raw)
            port = parts.port  # ValueError for a port that is no number or out of range
        except ValueError:
            raise ValueError("its port is not a number 1-65535") from None
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"the scheme is {parts.scheme + '://' if parts.scheme else 'missing'}, not http:// "
                             "or https://")
        if not parts.hostname:
            raise ValueError("it names no host")
        if port == 0:
            raise ValueError("its port is 0")
        return raw

    def render(self, value: str) -> str:
        return value


@dataclass(frozen=True)
class Dsn:
    """A PostgreSQL connection URL: ``postgresql://`` or ``postgres://``, with a host."""

    @property
    def accepts(self) -> str:
        return "a `postgresql://user:password@host:5432/database` DSN"

    def parse(self, raw: str) -> str:
        scheme = raw.partition("://")[0] if "://" in raw else ""
        if scheme not in ("postgresql", "postgres"):
            # the value is secret (it holds the password): only its scheme is said
            raise ValueError(f"the scheme is {scheme + '://' if scheme else 'missing'}, not postgresql://")
        try:
            parts = urlsplit(raw)
            port = parts.port
        except ValueError:
            raise ValueError("its port is not a number 1-65535") from None
        if port == 0:
            raise ValueError("its port is 0")
        if not parts.hostname and "host=" not in parts.query:
            raise ValueError("it names no host")
        return raw

    def render(self, value: str) -> str:
        return value


@dataclass(frozen=True)
class Port:
    """A TCP port; ``minimum`` 0 where 0 means "any free one" (or off) for that setting."""

    minimum: int = 1

    @property
    def accepts(self) -> str:
        return f"a port {self.minimum}-{HIGHEST_PORT}"

    def parse(self, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError("not an integer") from None
        if not self.minimum <= value <= HIGHEST_PORT:
            raise ValueError(f"outside {self.minimum}-{HIGHEST_PORT}")
        return value

    def render(self, value: int) -> str:
        return str(value)


@dataclass(frozen=True)
class File:
    """The path of a file that exists and this process may read (checked when the setting is read)."""

    what: str = "a readable file's path"

    @property
    def accepts(self) -> str:
        return self.what

    def parse(self, raw: str) -> str:
        if not os.path.isfile(raw):
            raise ValueError("no such file")
        if not os.access(raw, os.R_OK):
            raise ValueError("the file is not readable by this process")
        return raw

    def render(self, value: str) -> str:
        return value
