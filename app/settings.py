"""Typed settings built once from the environment (configuration layer).

Nothing else in Orderly reads ``os.environ``: processes call :func:`Settings.from_env` at start-up
and pass the object down.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

GATEWAYS = ("pg", "card", "paymos")
# How often the worker commits its offsets. With exactly-once its outputs are visible to the
# projector and the effects worker only once committed, so the interval is part of their latency;
# and every commit is a transaction per partition, so under load it is let grow to the busy
# interval (app/worker.py, next_commit_wait).
COMMIT_INTERVAL_S = {"at_least_once": 2.8, "exactly_once": 0.05}
BUSY_COMMIT_INTERVAL_S = {"at_least_once": 2.8, "exactly_once": 0.3}

# Development defaults (documented in the README). `orderly dev` and `orderly demo` use them;
# production processes must be given real values.
DEV_DEFAULTS: dict[str, str] = {
    "ORDERLY_KAFKA": "127.0.0.1:19092",
    "ORDERLY_POSTGRES_DSN": "postgresql://postgres@127.0.0.1:15432/postgres",
    "ORDERLY_SECRET_PG": "dev-pg-secret",
    "ORDERLY_SECRET_CARD": "whsec_ZGV2LWNhcmQtc2VjcmV0LWtleS0wMTIzNDU2Nzg5",
    "ORDERLY_SECRET_PAYMOS": "dev-paymos-secret",
    "ORDERLY_API_TOKEN": "dev-api-token",
}


class SettingsError(ValueError):
    """A setting is missing or unusable; the message names the variable and the fix."""


def _secrets(env: Mapping[str, str], gateway: str) -> tuple[str, ...]:
    name = f"ORDERLY_SECRET_{gateway.upper()}"
    raw = env.get(name)
    if raw is None:
        raise SettingsError(f"{name} is not set: every gateway needs its signing secret")
    # An empty HMAC key is forgeable by anyone, so an empty entry is an error, not "no check".
    parts = tuple(p.strip() for p in raw.split(","))
    if not parts or any(not p for p in parts):
        raise SettingsError(
            f"{name} holds an empty secret: an empty HMAC key is forgeable, set a real secret "
            "(comma-separated to rotate)"
        )
    return parts


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 1) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not an integer") from exc
    if value < minimum:
        raise SettingsError(f"{name}={value} is below the minimum {minimum}")
    return value


def _ms(env: Mapping[str, str], name: str, default_ms: int) -> float:
    """A whole number of milliseconds (0 or more), as seconds."""
    return _int(env, name, default_ms, minimum=0) / 1000


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise SettingsError(f"{name}={raw!r}: use 1/true/yes/on or 0/false/no/off")


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name) or default
    if raw.lower() not in choices:
        raise SettingsError(f"{name}={raw!r}: use one of {', '.join(choices)}")
    return raw.lower()


FAUST_LOGLEVELS = ("critical", "fatal", "error", "warn", "warning", "info", "debug")


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not a number") from exc
    if not value > 0 or value == math.inf:  # NaN compares false to everything
        raise SettingsError(f"{name}={raw!r} must be a finite positive number")
    return value


@dataclass(frozen=True)
class Settings:
    kafka_bootstrap: str
    postgres_dsn: str
    secrets: Mapping[str, tuple[str, ...]]
    api_token: str
    effects_url: str | None = None
    partitions: int = 12
    replication_factor: int = 1
    namespace: str = "orderly"
    ingest_host: str = "127.0.0.1"
    ingest_port: int = 8080
    append_timeout_s: float = 5.0
    read_timeout_s: float = 10.0  # a request body (or headers) not arrived by then: 408 and the socket closed
    processing_guarantee: str = "at_least_once"  # see README, "Exactly-once": Faust's is not safe here
    store: str = "rocksdb"  # where the worker keeps resource state: rocksdb (on disk) or memory
    worker_stall_s: float = 60.0  # a worker deciding nothing this long while records wait exits
    gc_threshold: int = 50_000  # allocations between young-generation collections (0: Python's 700)
    data_dir: Path = field(default_factory=lambda: Path(".orderly"))
    metrics_port: int = 0  # worker, projector, effects: serve /metrics here (0 = off)
    gap_backfill_after_s: float = 4 * 24 * 3600.0  # the pg document: a gap open 4 days is lost
    effects_max_attempts: int = 10
    effects_lease_s: float = 30.0  # a claimed effect is not claimed again for this long
    card_api_url: str | None = None  # the card gateway's API (GET /payments/{ref})
    pg_api_url: str | None = None  # the pg gateway's API (GET /v1/pay/events?since_sequence=N)
    fetch_parked_after_s: float = 60.0  # the playbook: a parked event older than this is fetched
    fetch_interval_s: float = 30.0
    sweep_after_s: float = 120.0  # a stored record with no decision this long after arrival is appended again
    fetch_rate_per_s: float = 10.0
    commit_interval_s: float | None = None  # the worker's commits; None: COMMIT_INTERVAL_S for the guarantee
    busy_commit_interval_s: float | None = None  # ... after a busy commit; None: BUSY_COMMIT_INTERVAL_S
    worker_batch_max: int = 1000  # records the worker takes per batch
    worker_busy_interval_s: float = 0.1  # after a large batch the worker takes the next no sooner than this
    sink_busy_interval_s: float = 0.1  # ... and so do the sinks (projector, effects)
    replay_processes: int = 0  # processes a replay's rebuild forks (0: one per core)
    faust_loglevel: str = "warn"
    debug_sinks: bool = False  # the sinks log at DEBUG
    event_loop: str = "uvloop"  # uvloop or asyncio

    @property
    def worker_commit_interval_s(self) -> float:
        return self.commit_interval_s or COMMIT_INTERVAL_S[self.processing_guarantee]

    @property
    def worker_busy_commit_interval_s(self) -> float:
        """Never shorter than the commit interval: a longer ORDERLY_COMMIT_INTERVAL_S applies throughout."""
        busy = self.busy_commit_interval_s or BUSY_COMMIT_INTERVAL_S[self.processing_guarantee]
        return max(busy, self.worker_commit_interval_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        missing = [n for n in ("ORDERLY_KAFKA", "ORDERLY_POSTGRES_DSN") if not env.get(n)]
        if missing:
            raise SettingsError(f"{', '.join(missing)} not set (see README, Configuration)")
        token = env.get("ORDERLY_API_TOKEN", "")
        if not token.strip():
            raise SettingsError("ORDERLY_API_TOKEN is empty: the correlation API needs a bearer token")
        store = env.get("ORDERLY_STORE", "rocksdb")
        if store not in ("rocksdb", "memory"):
            raise SettingsError(f"ORDERLY_STORE={store!r}: use rocksdb or memory")
        guarantee = env.get("ORDERLY_PROCESSING_GUARANTEE", "at_least_once")
        if guarantee not in ("exactly_once", "at_least_once"):
            raise SettingsError(
                f"ORDERLY_PROCESSING_GUARANTEE={guarantee!r}: use exactly_once or at_least_once"
            )
        namespace = env.get("ORDERLY_NAMESPACE", "orderly")
        if not namespace.replace("_", "").isalnum() or not namespace[:1].isalpha():
            raise SettingsError(
                f"ORDERLY_NAMESPACE={namespace!r}: letters, digits and '_' only, starting with a letter"
            )
        return cls(
            kafka_bootstrap=env["ORDERLY_KAFKA"],
            postgres_dsn=env["ORDERLY_POSTGRES_DSN"],
            secrets={g: _secrets(env, g) for g in GATEWAYS},
            api_token=token,
            effects_url=env.get("ORDERLY_EFFECTS_URL") or None,
            partitions=_int(env, "ORDERLY_PARTITIONS", 12),
            replication_factor=_int(env, "ORDERLY_REPLICATION_FACTOR", 1),
            namespace=namespace,
            ingest_host=env.get("ORDERLY_INGEST_HOST", "127.0.0.1"),
            ingest_port=_int(env, "ORDERLY_INGEST_PORT", 8080, minimum=0),
            append_timeout_s=_float(env, "ORDERLY_APPEND_TIMEOUT_S", 5.0),
            read_timeout_s=_float(env, "ORDERLY_READ_TIMEOUT_S", 10.0),
            processing_guarantee=guarantee,
            store=store,
            worker_stall_s=_float(env, "ORDERLY_WORKER_STALL_S", 60.0),
            gc_threshold=_int(env, "ORDERLY_GC_THRESHOLD", 50_000, minimum=0),
            data_dir=Path(env.get("ORDERLY_DATA_DIR", ".orderly")),
            metrics_port=_int(env, "ORDERLY_METRICS_PORT", 0, minimum=0),
            gap_backfill_after_s=_float(env, "ORDERLY_GAP_BACKFILL_AFTER_S", 4 * 24 * 3600.0),
            effects_max_attempts=_int(env, "ORDERLY_EFFECTS_MAX_ATTEMPTS", 10),
            effects_lease_s=_float(env, "ORDERLY_EFFECTS_LEASE_S", 30.0),
            card_api_url=env.get("ORDERLY_CARD_API_URL") or None,
            pg_api_url=env.get("ORDERLY_PG_API_URL") or None,
            fetch_parked_after_s=_float(env, "ORDERLY_FETCH_PARKED_AFTER_S", 60.0),
            fetch_interval_s=_float(env, "ORDERLY_FETCH_INTERVAL_S", 30.0),
            sweep_after_s=_float(env, "ORDERLY_SWEEP_AFTER_S", 120.0),
            fetch_rate_per_s=_float(env, "ORDERLY_FETCH_RATE_PER_S", 10.0),
            commit_interval_s=_float(env, "ORDERLY_COMMIT_INTERVAL_S", 0.0) or None,
            busy_commit_interval_s=_float(env, "ORDERLY_BUSY_COMMIT_INTERVAL_S", 0.0) or None,
            worker_batch_max=_int(env, "ORDERLY_WORKER_BATCH", 1000),
            worker_busy_interval_s=_ms(env, "ORDERLY_WORKER_BUSY_INTERVAL_MS", 100),
            sink_busy_interval_s=_ms(env, "ORDERLY_SINK_BUSY_INTERVAL_MS", 100),
            replay_processes=_int(env, "ORDERLY_REPLAY_PROCESSES", 0, minimum=0),
            faust_loglevel=_choice(env, "ORDERLY_FAUST_LOGLEVEL", "warn", FAUST_LOGLEVELS),
            debug_sinks=_flag(env, "ORDERLY_DEBUG_SINKS"),
            event_loop=_choice(env, "ORDERLY_LOOP", "uvloop", ("uvloop", "asyncio")),
        )

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        """The environment that makes a child process build these same settings."""
        env = {
            "ORDERLY_KAFKA": self.kafka_bootstrap,
            "ORDERLY_POSTGRES_DSN": self.postgres_dsn,
            "ORDERLY_API_TOKEN": self.api_token,
            "ORDERLY_PARTITIONS": str(self.partitions),
            "ORDERLY_REPLICATION_FACTOR": str(self.replication_factor),
            "ORDERLY_NAMESPACE": self.namespace,
            "ORDERLY_INGEST_HOST": self.ingest_host,
            "ORDERLY_INGEST_PORT": str(self.ingest_port),
            "ORDERLY_APPEND_TIMEOUT_S": str(self.append_timeout_s),
            "ORDERLY_READ_TIMEOUT_S": str(self.read_timeout_s),
            "ORDERLY_PROCESSING_GUARANTEE": self.processing_guarantee,
            "ORDERLY_STORE": self.store,
            "ORDERLY_WORKER_STALL_S": str(self.worker_stall_s),
            "ORDERLY_GC_THRESHOLD": str(self.gc_threshold),
            "ORDERLY_DATA_DIR": str(self.data_dir),
            "ORDERLY_METRICS_PORT": str(self.metrics_port),
            "ORDERLY_GAP_BACKFILL_AFTER_S": str(self.gap_backfill_after_s),
            "ORDERLY_EFFECTS_MAX_ATTEMPTS": str(self.effects_max_attempts),
            "ORDERLY_EFFECTS_LEASE_S": str(self.effects_lease_s),
        }
        env.update({f"ORDERLY_SECRET_{g.upper()}": ",".join(s) for g, s in self.secrets.items()})
        if self.effects_url:
            env["ORDERLY_EFFECTS_URL"] = self.effects_url
        if self.card_api_url:
            env["ORDERLY_CARD_API_URL"] = self.card_api_url
        if self.pg_api_url:
            env["ORDERLY_PG_API_URL"] = self.pg_api_url
        env["ORDERLY_FETCH_PARKED_AFTER_S"] = str(self.fetch_parked_after_s)
        env["ORDERLY_FETCH_INTERVAL_S"] = str(self.fetch_interval_s)
        env["ORDERLY_SWEEP_AFTER_S"] = str(self.sweep_after_s)
        env["ORDERLY_FETCH_RATE_PER_S"] = str(self.fetch_rate_per_s)
        if self.commit_interval_s:
            env["ORDERLY_COMMIT_INTERVAL_S"] = str(self.commit_interval_s)
        if self.busy_commit_interval_s:
            env["ORDERLY_BUSY_COMMIT_INTERVAL_S"] = str(self.busy_commit_interval_s)
        env["ORDERLY_WORKER_BATCH"] = str(self.worker_batch_max)
        env["ORDERLY_WORKER_BUSY_INTERVAL_MS"] = str(round(self.worker_busy_interval_s * 1000))
        env["ORDERLY_SINK_BUSY_INTERVAL_MS"] = str(round(self.sink_busy_interval_s * 1000))
        env["ORDERLY_REPLAY_PROCESSES"] = str(self.replay_processes)
        env["ORDERLY_FAUST_LOGLEVEL"] = self.faust_loglevel
        env["ORDERLY_DEBUG_SINKS"] = "1" if self.debug_sinks else "0"
        env["ORDERLY_LOOP"] = self.event_loop
        return env


def dev_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings for the embedded stack: the development defaults, overridden by the environment."""
    env = os.environ if env is None else env
    return Settings.from_env({**DEV_DEFAULTS, **env})
