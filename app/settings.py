"""Typed settings built once from the environment, from one table of settings (configuration layer).

Nothing else in Orderly reads ``os.environ``: processes call :func:`Settings.from_env` at start-up
and pass the object down. Each setting is declared once, as a row of :data:`TABLE`; parsing, the
error messages, :meth:`Settings.to_env` (a child process's environment), :data:`DEV_DEFAULTS` and
the configuration table of docs/configuration.md (``python -m app.settings --markdown``, ``make docs``)
come from it.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.gateways import registry
from app.setting_kinds import (
    REQUIRED,
    Choice,
    Directory,
    Flag,
    Integer,
    Maybe,
    Millis,
    Number,
    Secrets,
    Setting,
    SettingsError,
    Text,
)

# exactly-once: the broker aborts a worker's transaction open this long (app/worker/transactions.py;
# Kafka Streams' value, Kafka's default is 60 s): a worker lost for good holds its partitions that long
TRANSACTION_TIMEOUT_S = 10.0
__all__ = ["BUSY_COMMIT_INTERVAL_S", "COMMIT_INTERVAL_S", "DEV_DEFAULTS", "FAUST_LOGLEVELS", "GATEWAYS",
           "TABLE", "Settings", "SettingsError", "dev_settings", "markdown_table", "operator_settings",
           "with_markdown_table"]
GATEWAYS = tuple(registry.GATEWAYS)  # each reads its secrets from ORDERLY_SECRET_<NAME>
# How often the worker commits its offsets. With exactly-once its outputs are visible to the
# projector and the effects worker only once committed, so the interval is part of their latency;
# and every commit is a transaction per partition, so under load it is let grow to the busy
# interval (app/worker/consumer.py, next_commit_wait).
COMMIT_INTERVAL_S = {"at_least_once": 2.8, "exactly_once": 0.05}
BUSY_COMMIT_INTERVAL_S = {"at_least_once": 2.8, "exactly_once": 0.3}
# logging's level names, which Faust's worker takes in any case
FAUST_LOGLEVELS = ("critical", "fatal", "error", "warn", "warning", "info", "debug")



def _per_guarantee(seconds: Mapping[str, float]) -> str:
    return f"`{seconds['exactly_once']}` exactly-once, `{seconds['at_least_once']}` at-least-once"


# A gateway's secrets, one row per gateway of the registry (app/gateways/registry.py).
_SECRETS: tuple[Setting[Any], ...] = tuple(
    Setting("secrets", f"ORDERLY_SECRET_{g.name.upper()}", Secrets(), REQUIRED, g.secret_help, dev=g.dev_secret,
            key=g.name, is_secret=True) for g in registry.GATEWAYS.values())

# The settings, in the order docs/configuration.md lists them. A default is the typed value; `dev` is text.
# Left unannotated so that mypy infers each row's type and refuses a default its kind does not take.
_ROWS = (
    Setting("kafka_bootstrap", "ORDERLY_KAFKA", Text(what="host:port, comma-separated"), REQUIRED,
            "Kafka bootstrap servers", dev="127.0.0.1:19092"),
    Setting("postgres_dsn", "ORDERLY_POSTGRES_DSN", Text(what="a postgresql:// DSN"), REQUIRED,
            "PostgreSQL DSN", dev="postgresql://postgres@127.0.0.1:15432/postgres", is_secret=True),
    *_SECRETS,
    Setting("api_token", "ORDERLY_API_TOKEN", Text(), REQUIRED,
            "bearer token of the correlation API", dev="dev-api-token", is_secret=True),
    Setting("admin_token", "ORDERLY_ADMIN_TOKEN", Maybe(Text()), None,
            "bearer token of the admin API and the console's login (`orderly admin` refuses to start without "
            "it); keep it apart from the correlation token", dev="dev-admin-token", is_secret=True),
    Setting("admin_host", "ORDERLY_ADMIN_HOST", Text(what="a host name or address"), "127.0.0.1",
            "admin API and console bind address (never expose it to the gateways)"),
    Setting("admin_port", "ORDERLY_ADMIN_PORT", Integer(minimum=0), 8070, "admin API and console port"),
    Setting("effects_url", "ORDERLY_EFFECTS_URL", Maybe(Text(what="a URL")), None,
            "where the effects worker delivers effects (unset: recorded, not delivered)"),
    Setting("effects_secret", "ORDERLY_EFFECTS_SECRET",
            Maybe(Text(r"whsec_[A-Za-z0-9+/]{16,}={0,2}", "`whsec_` and a base64 key of 12+ bytes")), None,
            "Standard Webhooks signing secret of delivered effects (required with `ORDERLY_EFFECTS_URL`)",
            dev="whsec_ZGV2LWVmZmVjdHMtc2lnbmluZy1zZWNyZXQ=", is_secret=True),
    Setting("effects_concurrency", "ORDERLY_EFFECTS_CONCURRENCY", Integer(minimum=1), 32,
            "effect deliveries in flight at most"),
    Setting("partitions", "ORDERLY_PARTITIONS", Integer(minimum=1), 12,
            "partitions of every co-partitioned topic"),
    Setting("replication_factor", "ORDERLY_REPLICATION_FACTOR", Integer(minimum=1), 1,
            "topic replication factor"),
    Setting("min_insync_replicas", "ORDERLY_MIN_INSYNC_REPLICAS", Maybe(Integer(minimum=1)), None,
            "replicas that must hold a write before Kafka acknowledges it, for every Orderly topic and the "
            "worker's changelog (unset: `2` with 3+ replicas, else `1`)"),
    # How every producer, consumer, admin client and the Faust worker reach Kafka (app/kafka_client.py,
    # which also refuses inconsistent combinations at start-up).
    Setting("kafka_security_protocol", "ORDERLY_KAFKA_SECURITY_PROTOCOL",
            Choice(("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")), "plaintext",
            "how clients talk to Kafka: TLS (`ssl`, `sasl_ssl`) and/or SASL authentication (`sasl_*`)"),
    Setting("kafka_sasl_mechanism", "ORDERLY_KAFKA_SASL_MECHANISM",
            Maybe(Choice(("plain", "scram-sha-256", "scram-sha-512"))), None,
            "SASL mechanism (required with `sasl_*`)"),
    Setting("kafka_sasl_username", "ORDERLY_KAFKA_SASL_USERNAME", Maybe(Text()), None,
            "SASL user name (required with `sasl_*`)"),
    Setting("kafka_sasl_password", "ORDERLY_KAFKA_SASL_PASSWORD", Maybe(Text()), None,
            "SASL password (required with `sasl_*`)", is_secret=True),
    Setting("kafka_ssl_cafile", "ORDERLY_KAFKA_SSL_CAFILE", Maybe(Text(what="a PEM file path")), None,
            "CA certificates the brokers' certificates are checked against (`ssl`, `sasl_ssl`); unset: the "
            "system's"),
    Setting("kafka_ssl_certfile", "ORDERLY_KAFKA_SSL_CERTFILE", Maybe(Text(what="a PEM file path")), None,
            "client certificate chain for brokers that require one (mutual TLS); may hold the key too"),
    Setting("kafka_ssl_keyfile", "ORDERLY_KAFKA_SSL_KEYFILE", Maybe(Text(what="a PEM file path")), None,
            "the client certificate's private key, if not in `ORDERLY_KAFKA_SSL_CERTFILE`"),
    Setting("kafka_ssl_key_password", "ORDERLY_KAFKA_SSL_KEY_PASSWORD", Maybe(Text()), None,
            "password of an encrypted client key", is_secret=True),
    Setting("kafka_ssl_check_hostname", "ORDERLY_KAFKA_SSL_CHECK_HOSTNAME", Flag(), True,
            "the broker certificate must name the host connected to (`0` only for certificates without the "
            "right names; the chain is still verified)"),
    # It prefixes topic names (Kafka takes [A-Za-z0-9._-]) and is a PostgreSQL schema name.
    Setting("namespace", "ORDERLY_NAMESPACE",
            Text(r"[A-Za-z][A-Za-z0-9_]*", "ASCII letters, digits and '_', starting with a letter"),
            "orderly", "topic prefix and PostgreSQL schema"),
    Setting("ingest_host", "ORDERLY_INGEST_HOST", Text(what="a host name or address"), "127.0.0.1",
            "ingest bind address"),
    Setting("ingest_port", "ORDERLY_INGEST_PORT", Integer(minimum=0), 8080, "ingest port"),
    Setting("append_timeout_s", "ORDERLY_APPEND_TIMEOUT_S", Number(), 5.0,
            "deadline in seconds for a Kafka append before answering 503"),
    Setting("read_timeout_s", "ORDERLY_READ_TIMEOUT_S", Number(), 10.0,
            "a request whose body has not arrived within this many seconds gets 408 and is closed"),
    Setting("processing_guarantee", "ORDERLY_PROCESSING_GUARANTEE", Choice(("at_least_once", "exactly_once")),
            "at_least_once", "the worker's Kafka guarantee (docs/architecture.md)"),
    Setting("store", "ORDERLY_STORE", Choice(("rocksdb", "memory")), "rocksdb",
            "the worker's state store; `memory` rebuilds all of it from the changelog at each start"),
    Setting("worker_stall_s", "ORDERLY_WORKER_STALL_S", Number(), 60.0,
            "a worker that decides nothing this many seconds while records wait exits (code 3) for its "
            "supervisor to restart it"),
    # Kafka's static membership (KIP-345): a worker that comes back under its id within the session
    # timeout gets its partitions back at once, instead of the group waiting out the dead member.
    Setting("worker_instance_id", "ORDERLY_WORKER_INSTANCE_ID",
            Maybe(Text(r"[A-Za-z0-9._{}-]{1,200}", "ASCII letters, digits, '.', '_', '-' and {hostname}")), None,
            "this worker's static member id in its consumer group, unique per worker (`orderly dev` sets "
            "`worker-1`, `worker-2`, …; `{hostname}` stands for the host's name, e.g. a container's): a "
            "restarted worker takes its partitions back at once instead of after the 10 s session; a worker "
            "stopped for good holds them those 10 s. With exactly-once it also names the worker's "
            "transactional producer (`<namespace>-worker-worker-<id>`), which commits all its partitions in "
            "one transaction per commit instead of one per partition (docs/architecture.md)"),
    Setting("worker_batch_max", "ORDERLY_WORKER_BATCH", Integer(minimum=1), 1000,
            "records the worker takes and decides per batch, at most"),
    Setting("worker_busy_interval_s", "ORDERLY_WORKER_BUSY_INTERVAL_MS", Millis(), 0.1,
            "under load (batches of 100+), the worker's next batch waits this long, so that it grows"),
    Setting("sink_busy_interval_s", "ORDERLY_SINK_BUSY_INTERVAL_MS", Millis(), 0.1,
            "the same for the projector and the effects recorder"),
    Setting("gc_threshold", "ORDERLY_GC_THRESHOLD", Integer(minimum=0), 50_000,
            "allocations between Python's young-generation collections (`0`: Python's 700)"),
    Setting("event_loop", "ORDERLY_LOOP", Choice(("uvloop", "asyncio")), "uvloop",
            "event loop of every process"),
    Setting("faust_loglevel", "ORDERLY_FAUST_LOGLEVEL", Choice(FAUST_LOGLEVELS), "warn",
            "log level of the worker's Faust runtime"),
    Setting("debug_sinks", "ORDERLY_DEBUG_SINKS", Flag(), False,
            "the projector's and effects recorder's sinks log each batch (logger `orderly.sink` at DEBUG)"),
    Setting("replay_processes", "ORDERLY_REPLAY_PROCESSES", Integer(minimum=0), 0,
            "processes `orderly replay` splits the partitions across (logs of 20,000+ records); `0`: one "
            "per core"),
    Setting("data_dir", "ORDERLY_DATA_DIR", Directory(), Path(".orderly"),
            "where `orderly dev` keeps Kafka and PostgreSQL data"),
    Setting("metrics_port", "ORDERLY_METRICS_PORT", Integer(minimum=0), 0,
            "`/metrics` port of ingest, worker, projector, effects, fetcher (`0`: off; the admin serves it on "
            "its own port); `orderly dev` gives each a port of its own (a free port if that one is taken)"),
    Setting("metrics_host", "ORDERLY_METRICS_HOST", Text(what="a host name or address"), "127.0.0.1",
            "address every process's `/metrics` binds (`0.0.0.0` for a Prometheus on another host or container)"),
    Setting("log_format", "ORDERLY_LOG_FORMAT", Choice(("text", "json")), "text",
            "log lines of every process: `json` (one object a line: timestamp, level, logger, message, gateway, "
            "delivery_id, resource_id) or `text`"),
    Setting("gap_backfill_after_s", "ORDERLY_GAP_BACKFILL_AFTER_S", Number(), 4 * 24 * 3600.0,
            "age in seconds at which an open pg sequence gap is sent to `orderly.fetch` (the pg "
            "document: a gap open 4 days is lost)"),
    Setting("effects_max_attempts", "ORDERLY_EFFECTS_MAX_ATTEMPTS", Integer(minimum=1), 10,
            "delivery attempts before an effect is marked dead"),
    Setting("effects_lease_s", "ORDERLY_EFFECTS_LEASE_S", Number(), 30.0,
            "seconds before a claimed, undelivered effect may be claimed again"),
    Setting("card_api_url", "ORDERLY_CARD_API_URL", Maybe(Text(what="a URL")), None,
            "the card gateway's API base (`GET /payments/{ref}`); unset: no fetching"),
    Setting("pg_api_url", "ORDERLY_PG_API_URL", Maybe(Text(what="a URL")), None,
            "the pg gateway's API base (`GET /v1/pay/events?since_sequence=N`); unset: no backfill"),
    Setting("fetch_parked_after_s", "ORDERLY_FETCH_PARKED_AFTER_S", Number(), 60.0,
            "a card payment whose events stay parked longer than this many seconds is fetched from the card "
            "API"),
    Setting("fetch_interval_s", "ORDERLY_FETCH_INTERVAL_S", Number(), 30.0,
            "seconds between the fetcher's looks for parked card payments"),
    Setting("fetch_rate_per_s", "ORDERLY_FETCH_RATE_PER_S", Number(), 10.0,
            "the fetcher's requests per second to the gateways' APIs, at most"),
    Setting("sweep_after_s", "ORDERLY_SWEEP_AFTER_S", Number(), 120.0,
            "a stored record with no decision this many seconds after arrival is appended again (sweeper)"),
    Setting("commit_interval_s", "ORDERLY_COMMIT_INTERVAL_S", Maybe(Number()), None,
            f"seconds between the worker's commits; unset: {_per_guarantee(COMMIT_INTERVAL_S)}; with "
            f"exactly-once at most {TRANSACTION_TIMEOUT_S / 2:g}"),
    Setting("busy_commit_interval_s", "ORDERLY_BUSY_COMMIT_INTERVAL_S", Maybe(Number()), None,
            f"the same after a commit of 250+ records; unset: {_per_guarantee(BUSY_COMMIT_INTERVAL_S)}; "
            f"with exactly-once at most {TRANSACTION_TIMEOUT_S / 2:g}"),
)
TABLE: tuple[Setting[Any], ...] = _ROWS
# Development defaults (docs/configuration.md's `orderly dev` column). `orderly dev` and `orderly demo` use
# them; production processes must be given real values.
DEV_DEFAULTS: dict[str, str] = {row.env: row.dev for row in TABLE if row.dev is not None}


@dataclass(frozen=True)
class Settings:
    """The typed view of TABLE: one attribute per row (the secrets' rows share ``secrets``)."""

    kafka_bootstrap: str
    postgres_dsn: str
    secrets: Mapping[str, tuple[str, ...]]  # gateway -> its secrets, newest first
    api_token: str
    admin_token: str | None
    admin_host: str
    admin_port: int
    effects_url: str | None
    effects_secret: str | None
    effects_concurrency: int
    partitions: int
    replication_factor: int
    min_insync_replicas: int | None
    kafka_security_protocol: str
    kafka_sasl_mechanism: str | None
    kafka_sasl_username: str | None
    kafka_sasl_password: str | None
    kafka_ssl_cafile: str | None
    kafka_ssl_certfile: str | None
    kafka_ssl_keyfile: str | None
    kafka_ssl_key_password: str | None
    kafka_ssl_check_hostname: bool
    namespace: str
    ingest_host: str
    ingest_port: int
    append_timeout_s: float
    read_timeout_s: float
    processing_guarantee: str
    store: str
    worker_stall_s: float
    worker_instance_id: str | None
    worker_batch_max: int
    worker_busy_interval_s: float
    sink_busy_interval_s: float
    gc_threshold: int
    event_loop: str
    faust_loglevel: str
    debug_sinks: bool
    replay_processes: int
    data_dir: Path
    metrics_port: int
    metrics_host: str
    log_format: str
    gap_backfill_after_s: float
    effects_max_attempts: int
    effects_lease_s: float
    card_api_url: str | None
    pg_api_url: str | None
    fetch_parked_after_s: float
    fetch_interval_s: float
    fetch_rate_per_s: float
    sweep_after_s: float
    commit_interval_s: float | None
    busy_commit_interval_s: float | None

    @property
    def worker_member(self) -> str | None:
        """The worker's group.instance.id: ORDERLY_WORKER_INSTANCE_ID with {hostname} filled in."""
        if self.worker_instance_id is None:
            return None
        return self.worker_instance_id.replace("{hostname}", socket.gethostname())

    @property
    def min_insync(self) -> int:
        """ORDERLY_MIN_INSYNC_REPLICAS, or what the replication factor allows: 2 with 3+ replicas."""
        if self.min_insync_replicas is not None:
            return self.min_insync_replicas
        return 2 if self.replication_factor >= 3 else 1

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
        """Every row read; every refusal reported at once, so one start says all that is wrong."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        errors: list[str] = []
        for row in TABLE:
            try:
                value = row.read(env)
            except SettingsError as exc:
                errors.append(str(exc))
                continue
            if row.key is None:
                values[row.field] = value
            else:
                values.setdefault(row.field, {})[row.key] = value
        if errors:
            raise SettingsError("\n".join(errors))
        settings = cls(**values)
        from app.kafka_client import security_errors  # the Kafka security rows' combinations and files

        problems = security_errors(settings)
        if settings.min_insync > settings.replication_factor:
            problems.append(f"ORDERLY_MIN_INSYNC_REPLICAS: {settings.min_insync} is more than the "
                            f"{settings.replication_factor} replicas of ORDERLY_REPLICATION_FACTOR: no write "
                            "could ever be acknowledged")
        elif settings.replication_factor > 1 and settings.min_insync == settings.replication_factor:
            problems.append(f"ORDERLY_MIN_INSYNC_REPLICAS: {settings.min_insync} of {settings.replication_factor} "
                            "replicas: losing any one broker would stop every write (503s); use at most "
                            f"{settings.replication_factor - 1}")
        longest = TRANSACTION_TIMEOUT_S / 2  # a transaction lasts one commit interval, and its batch's writes
        for variable, value in (("ORDERLY_COMMIT_INTERVAL_S", settings.commit_interval_s),
                                ("ORDERLY_BUSY_COMMIT_INTERVAL_S", settings.busy_commit_interval_s)):
            if settings.processing_guarantee == "exactly_once" and value is not None and value > longest:
                problems.append(f"{variable}: {value:g} s with exactly-once; at most {longest:g} s: a transaction "
                                f"lasts one commit interval, and the broker aborts one open for "
                                f"{TRANSACTION_TIMEOUT_S:g} s (the worker would restart at every commit)")
        if problems:
            raise SettingsError("\n".join(problems))
        return settings

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        """The environment that makes a child process build these same settings. Every variable is
        set, an unset one as empty, so that it also overrides what the parent's environment holds."""
        return {row.env: row.kind.render(row.value(self)) for row in TABLE}


def dev_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings for the embedded stack: the development defaults, overridden by the environment."""
    env = os.environ if env is None else env
    return Settings.from_env({**DEV_DEFAULTS, **env})


def operator_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings for a command an operator runs by hand: from the environment, or — when it names no
    Kafka or PostgreSQL — from the ``stack.json`` of an `orderly dev` running next to it (in
    ``ORDERLY_DATA_DIR``, default ``.orderly``), with the development defaults for the rest."""
    import json

    env = os.environ if env is None else env
    if env.get("ORDERLY_KAFKA") and env.get("ORDERLY_POSTGRES_DSN"):
        return Settings.from_env(env)
    stack_file = Path(env.get("ORDERLY_DATA_DIR") or ".orderly") / "stack.json"
    try:
        stack = json.loads(stack_file.read_text())
        found = {"ORDERLY_KAFKA": str(stack["kafka_bootstrap"]), "ORDERLY_POSTGRES_DSN": str(stack["postgres_dsn"])}
        if stack.get("namespace") and not env.get("ORDERLY_NAMESPACE"):
            found["ORDERLY_NAMESPACE"] = str(stack["namespace"])
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return Settings.from_env(env)
        except SettingsError as exc:
            raise SettingsError(f"{exc}\n(and no running `orderly dev` was found: {stack_file} is missing or "
                                "unreadable)") from None
    return dev_settings({**env, **found})


def markdown_table() -> str:
    """docs/configuration.md's table, rendered from TABLE."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    def code(text: str) -> str:
        return f"`{text}`" if text not in ("required", "unset") else text

    lines = ["| variable | accepts | default | `orderly dev` default (if other) | meaning |", "|---|---|---|---|---|"]
    for row in TABLE:
        dev = code(row.dev) if row.dev is not None else ""
        lines.append(f"| `{row.env}` | {cell(row.kind.accepts)} | {code(row.text_default())} | {dev} "
                     f"| {cell(row.description)} |")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- settings:begin -->\n", "<!-- settings:end -->"


def with_markdown_table(readme: str) -> str:
    """``readme`` with the text between its settings markers replaced by :func:`markdown_table`."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {BEGIN.strip()} … {END} section")
    return readme[: start + len(BEGIN)] + markdown_table() + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.settings", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print the configuration table")
    parser.add_argument("--readme", type=Path, help="rewrite this file's section between the settings markers "
                                                    "(docs/configuration.md)")
    args = parser.parse_args(argv)
    if args.readme:
        text = args.readme.read_text(encoding="utf-8")
        args.readme.write_text(with_markdown_table(text), encoding="utf-8")
    if args.markdown or not args.readme:
        sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
