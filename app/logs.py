"""How every process logs: text or JSON lines (ORDERLY_LOG_FORMAT), context fields, secrets kept
out, and sampling for lines a flood could repeat without end (I/O shell).

A JSON line carries ``timestamp`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``, plus, where
the code knows them, ``gateway``, ``delivery_id`` and ``resource_id``: passed with ``extra=`` or bound
for a stretch of code with :func:`bound` (a contextvar, so each request's task has its own). The
worker's Faust runtime logs through the same handler (app/worker/app.py passes
:func:`logging_config` to Faust's worker, which would otherwise install its own).

Secrets never reach a line: :func:`protect` registers the configured secret values (gateway
secrets, tokens, the PostgreSQL password) and every line has them replaced; fields whose names say
they hold a secret or a body are dropped to ``[redacted]`` whatever their value. Bodies and payloads
are not logged by the code in the first place (they carry personal data).
"""

from __future__ import annotations

import contextlib
import logging
import logging.config
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pythonjsonlogger.orjson import OrjsonFormatter

from app.setting_kinds import Secret

if TYPE_CHECKING:
    from app.settings import Settings

__all__ = ["CONTEXT_FIELDS", "ContextFilter", "JsonFormatter", "SampledLog", "TextFormatter", "bound", "configure",
           "logging_config", "protect"]

CONTEXT_FIELDS = ("gateway", "delivery_id", "resource_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
REDACTED = "[redacted]"
# a field whose name says it holds one of these is never written, whatever its value
_SECRET_NAME = re.compile(r"secret|token|password|passwd|authorization|signature|cookie|api[_-]?key|body|payload",
                          re.IGNORECASE)
_MIN_SECRET = 6  # shorter values would blank out ordinary words

_context: ContextVar[Mapping[str, str] | None] = ContextVar("orderly_log_context", default=None)
_secrets: list[str] = []


@contextlib.contextmanager
def bound(**fields: str | None) -> Iterator[None]:
    """Every line logged inside the block (in this task) carries ``fields`` (None values are left out)."""
    outer = _context.get() or {}
    token = _context.set({**outer, **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def protect(values: list[str | None]) -> None:
    """Values never to be written into a line (replaced by ``[redacted]``), longest first."""
    found = {v for v in values if v and len(v) >= _MIN_SECRET}
    _secrets[:] = sorted(found | set(_secrets), key=len, reverse=True)


def secrets_of(settings: Settings) -> list[str | None]:
    """The secret values a Settings object holds: every row marked secret (gateway secrets, tokens,
    passwords, the whole DSN) and the password inside the DSN."""
    from app.settings import TABLE

    values: list[str | None] = []
    for row in TABLE:
        if row.is_secret:
            value = row.value(settings)
            value = value.reveal() if isinstance(value, Secret) else value
            values += list(value) if isinstance(value, tuple) else [value if isinstance(value, str) else None]
    with contextlib.suppress(ValueError):
        values.append(urlsplit(settings.postgres_dsn.reveal()).password)
    return values


def scrub(text: str) -> str:
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


class ContextFilter(logging.Filter):
    """Adds the bound context fields to a record that does not carry them already."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _context.get()
        if context:
            for key, value in context.items():
                if not hasattr(record, key):
                    setattr(record, key, value)
        return True


class JsonFormatter(OrjsonFormatter):
    """One JSON object a line: timestamp, level, logger, message, the context and ``extra`` fields."""

    def __init__(self) -> None:
        super().__init__(["levelname", "name", "message"], rename_fields={"levelname": "level", "name": "logger"},
                         timestamp=True)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        for key, value in log_data.items():
            if _SECRET_NAME.search(key):
                log_data[key] = REDACTED
            elif isinstance(value, str):
                log_data[key] = scrub(value)
        return log_data


class TextFormatter(logging.Formatter):
    """The plain lines, with the context fields appended as ``key=value`` and secrets scrubbed."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(f"{k}={getattr(record, k)}" for k in CONTEXT_FIELDS if getattr(record, k, None))
        return scrub(f"{line} [{context}]" if context else line)


def logging_config(fmt: str, level: int | str = logging.INFO) -> dict[str, Any]:
    """A logging.config.dictConfig for ``fmt`` ("json" or "text"): one handler on the root, to stdout
    (the supervisor or the container runtime keeps the stream)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": {"()": JsonFormatter if fmt == "json" else TextFormatter}},
        "filters": {"context": {"()": ContextFilter}},
        "handlers": {"default": {"class": "logging.StreamHandler", "stream": sys.stderr, "formatter": "default",
                                 "filters": ["context"]}},
        "root": {"level": level, "handlers": ["default"]},
    }


def configure(fmt: str, level: int | str = logging.INFO) -> None:
    logging.config.dictConfig(logging_config(fmt, level))
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


class SampledLog:
    """At most ``first`` lines per key (e.g. gateway and reason) per ``window_s``; the lines past
    that are counted, not written, and once the window is over one line says how many were
    suppressed. A flood of bad requests thus writes a bounded number of lines a minute whatever its
    rate. Keys past ``max_keys`` share one key (``other``), so that varied keys cannot grow the table
    either. Thread-safe (the ingest also runs in test threads)."""

    def __init__(self, logger: logging.Logger, first: int = 5, window_s: float = 60.0, max_keys: int = 1000,
                 clock: Callable[[], float] = time.monotonic,
                 on_suppressed: Callable[[tuple[str, ...]], None] | None = None) -> None:
        self.logger = logger
        self.first = first
        self.window_s = window_s
        self.max_keys = max_keys
        self.clock = clock
        self.on_suppressed = on_suppressed
        self._windows: dict[tuple[str, ...], list[float]] = {}  # key -> [window start, written, suppressed]
        self._lock = threading.Lock()

    def log(self, level: int, key: tuple[str, ...], msg: str, *args: object,
            extra: Mapping[str, object] | None = None) -> bool:
        """Log the line unless its key's quota for this window is spent; True when written."""
        now = self.clock()
        with self._lock:
            ended = self._expire(now)
            if key not in self._windows and len(self._windows) >= self.max_keys:
                key = ("other",)
            window = self._windows.setdefault(key, [now, 0, 0])
            write = window[1] < self.first
            window[1 if write else 2] += 1
        self._report(ended)
        if write:
            self.logger.log(level, msg, *args, extra=extra)
        elif self.on_suppressed is not None:
            self.on_suppressed(key)
        return write

    def flush(self) -> int:
        """Report every window that has ended (called every few seconds, so that the count of a
        flood that stopped is still written); returns the lines reported as suppressed."""
        with self._lock:
            ended = self._expire(self.clock())
        return self._report(ended)

    def _expire(self, now: float) -> list[tuple[tuple[str, ...], int]]:
        ended = [(key, int(w[2])) for key, w in self._windows.items() if now - w[0] >= self.window_s]
        for key, _ in ended:
            del self._windows[key]
        return [(key, n) for key, n in ended if n]

    def _report(self, ended: list[tuple[tuple[str, ...], int]]) -> int:
        for key, suppressed in ended:
            self.logger.warning("%d more lines like this were suppressed in %.0f s (%s)", suppressed, self.window_s,
                                "/".join(key), extra={"suppressed": suppressed, "sample_key": "/".join(key)})
        return sum(n for _, n in ended)
