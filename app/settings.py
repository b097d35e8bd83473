"""The typed settings, each declared once as an attribute of :class:`Settings`, built once from the
environment (configuration layer).

Nothing else in Orderly reads ``os.environ``: processes call :meth:`Settings.from_env` at start-up
and pass the object down. Each setting is one :class:`~app.setting_kinds.Setting` on the class:
parsing, the error messages, :meth:`Settings.to_env` (a child's environment), :data:`DEV_DEFAULTS`
and docs/configuration.md's table (``python -m app.settings_doc --readme docs/configuration.md``) come
from it. Choices are Literals; tokens, passwords, the DSN and signing secrets are
:class:`~app.setting_kinds.Secret`, which never prints. (pydantic-settings, measured against this,
costs every process and command about 80 ms more to import and 1.2 ms instead of 12 µs to build.)
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Mapping
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any, Literal, get_args

from app.address_kinds import Dsn, File, HostPorts, Port, Url
from app.gateways import registry
from app.kafka_client import SaslMechanism, SecurityProtocol, security_errors
from app.setting_kinds import (
    REQUIRED,
    Choice,
    Directory,
    Flag,
    Hidden,
    Integer,
    Keyed,
    Maybe,
    Millis,
    Names,
    Number,
    Secret,
    Secrets,
    Setting,
    SettingsError,
    Text,
)
from app.settings_admin import IDENTITY  # the admin's identity settings (DESIGN.md §3.1)

# exactly-once: the broker aborts a worker's transaction open this long (app/seams/faust/producer.py;
# Kafka's default is 60 s, Kafka Streams' 10): the backstop when the worker taking a lost one's partitions
# over cannot abort its transaction itself (app/worker/takeover.py), plus the broker's scan for them
# (transaction.abort.timed.out.transaction.cleanup.interval.ms). A
# transaction lasts one commit interval (0.3 s busy); 4 s also outlasts a broker's loss, whose partitions
# wait for new leaders for the cluster's 1.5 s broker session (app/stack/kafka.py) while it is open.
TRANSACTION_TIMEOUT_S = 4.0
# How long the worker's Kafka clients wait for one request's answer (Faust's broker_request_timeout,
# its default, set explicitly: an at-least-once commit's deadline is derived from it, app/worker/commit.py).
WORKER_REQUEST_TIMEOUT_S = 90.0
__all__ = ["BUSY_COMMIT_INTERVAL_S", "COMMIT_INTERVAL_S", "DEV_DEFAULTS", "FAUST_LOGLEVELS", "GATEWAYS",
           "TABLE", "EventLoop", "FaustLoglevel", "Guarantee", "LogFormat", "Secret", "Settings", "SettingsError",
           "Store", "dev_settings"]
GATEWAYS = tuple(registry.GATEWAYS)  # each reads its secrets from ORDERLY_SECRET_<NAME>

Guarantee = Literal["at_least_once", "exactly_once"]
Store = Literal["rocksdb", "memory"]
EventLoop = Literal["uvloop", "asyncio"]
LogFormat = Literal["text", "json"]
# logging's level names, which Faust's worker takes in any case
FaustLoglevel = Literal["critical", "fatal", "error", "warn", "warning", "info", "debug"]
FAUST_LOGLEVELS: tuple[FaustLoglevel, ...] = get_args(FaustLoglevel)

# How often the worker commits its offsets. With exactly-once its outputs are visible to the
# projector and the effects worker only once committed, so the interval is part of their latency;
# and every commit is a transaction per partition, so under load it is let grow to the busy
# interval (app/worker/consumer.py, next_commit_wait).
COMMIT_INTERVAL_S: dict[Guarantee, float] = {"at_least_once": 2.8, "exactly_once": 0.05}
BUSY_COMMIT_INTERVAL_S: dict[Guarantee, float] = {"at_least_once": 2.8, "exactly_once": 0.3}


def _per_guarantee(seconds: Mapping[Guarantee, float]) -> str:
    return f"`{seconds['exactly_once']}` exactly-once, `{seconds['at_least_once']}` at-least-once"


class Settings:
    """One attribute per setting, in the order docs/configuration.md lists them (the secrets' rows
    share ``secrets``). A default is the typed value, ``dev`` the text `orderly dev` uses. Frozen:
    :meth:`with_overrides` makes a changed copy."""

    kafka_bootstrap = Setting("ORDERLY_KAFKA", HostPorts(), REQUIRED,
            "Kafka bootstrap servers", dev="127.0.0.1:19092")
    postgres_dsn = Setting("ORDERLY_POSTGRES_DSN", Hidden(Dsn()), REQUIRED,
            "PostgreSQL DSN", dev="postgresql://postgres@127.0.0.1:15432/postgres")
    # The enabled gateways (DESIGN.md §2.7): their webhook routes and other routes are served, their
    # secrets read; a disabled gateway's routes answer 404 and its secret is not asked for.
    gateways = Setting("ORDERLY_GATEWAYS", Names(lambda: registry.GATEWAYS, "gateway"), tuple(registry.GATEWAYS),
            "the gateways served; only theirs of the `ORDERLY_SECRET_<NAME>` rows below are read (unset: all)")
    # A gateway's secrets, one per gateway of the registry (app/gateways/registry.py), read for the
    # enabled ones only: ``secrets`` holds exactly those.
    secrets = Keyed({g.name: Setting(f"ORDERLY_SECRET_{g.name.upper()}", Hidden(Secrets()), REQUIRED, g.secret_help,
                                     dev=g.dev_secret) for g in registry.GATEWAYS.values()})
    adyen_basic_auth = Setting("ORDERLY_ADYEN_BASIC_AUTH", Maybe(Hidden(Text(r"[^:\s]+:\S.*", "`user:password`"))),
            None, "HTTP Basic credentials Adyen sends on `/webhooks/adyen` (unset: not asked; HMAC always checked)")
    api_token = Setting("ORDERLY_API_TOKEN", Hidden(Text()), REQUIRED,
            "bearer token of the correlation API", dev="dev-api-token")
    (admin_token, admin_oidc_issuer, admin_oidc_client_id, admin_oidc_client_secret, admin_oidc_redirect_url,
     admin_roles_claim, admin_role_map, admin_session_idle_s, admin_session_max_s, admin_trusted_proxies) = IDENTITY
    admin_host = Setting("ORDERLY_ADMIN_HOST", Text(what="a host name or address"), "127.0.0.1",
            "admin API and console bind address (never expose it to the gateways)")
    admin_port = Setting("ORDERLY_ADMIN_PORT", Port(minimum=0), 8070, "admin API and console port")
    effects_url = Setting("ORDERLY_EFFECTS_URL", Maybe(Url()), None,
            "where the effects worker delivers effects (unset: recorded, not delivered)")
    effects_secret = Setting("ORDERLY_EFFECTS_SECRET",
            Maybe(Hidden(Text(r"whsec_[A-Za-z0-9+/]{16,}={0,2}", "`whsec_` and a base64 key of 12+ bytes"))), None,
            "Standard Webhooks signing secret of delivered effects (required with `ORDERLY_EFFECTS_URL`)",
            dev="whsec_ZGV2LWVmZmVjdHMtc2lnbmluZy1zZWNyZXQ=")
    effects_allow_http = Setting("ORDERLY_EFFECTS_ALLOW_HTTP", Flag(), False, "deliver effects over `http://` to a "
            "host that is not loopback (off: `https://`, or `http://` to 127.0.0.1, ::1 or localhost only)")
    effects_concurrency = Setting("ORDERLY_EFFECTS_CONCURRENCY", Integer(minimum=1), 32,
            "effect deliveries in flight at most")
    partitions = Setting("ORDERLY_PARTITIONS", Integer(minimum=1), 12, "partitions of every co-partitioned topic")
    replication_factor = Setting("ORDERLY_REPLICATION_FACTOR", Integer(minimum=1), 1, "topic replication factor")
    min_insync_replicas = Setting("ORDERLY_MIN_INSYNC_REPLICAS", Maybe(Integer(minimum=1)), None,
            "replicas that must hold a write before Kafka acknowledges it, for every Orderly topic and the "
            "worker's changelog (unset: `2` with 3+ replicas, else `1`)")
    raw_retention_ms = Setting("ORDERLY_RAW_RETENTION_MS", Maybe(Integer(minimum=86_400_000)), None,
            "how long `orderly.raw` keeps a webhook, in ms, at least a day (unset: for ever, DESIGN §4: replay "
            "rebuilds from it; set on the topic at every start; docs/operations.md, Personal data)")
    # How every producer, consumer, admin client and the Faust worker reach Kafka (app/kafka_client.py,
    # which also refuses inconsistent combinations at start-up).
    kafka_security_protocol = Setting("ORDERLY_KAFKA_SECURITY_PROTOCOL",
            Choice[SecurityProtocol](get_args(SecurityProtocol)), "plaintext",
            "how clients talk to Kafka: TLS (`ssl`, `sasl_ssl`) and/or SASL authentication (`sasl_*`)")
    kafka_sasl_mechanism = Setting("ORDERLY_KAFKA_SASL_MECHANISM",
            Maybe(Choice[SaslMechanism](get_args(SaslMechanism))), None,
            "SASL mechanism (required with `sasl_*`)")
    kafka_sasl_username = Setting("ORDERLY_KAFKA_SASL_USERNAME", Maybe(Text()), None,
            "SASL user name (required with `sasl_*`)")
    kafka_sasl_password = Setting("ORDERLY_KAFKA_SASL_PASSWORD", Maybe(Hidden(Text())), None,
            "SASL password (required with `sasl_*`)")
    kafka_ssl_cafile = Setting("ORDERLY_KAFKA_SSL_CAFILE", Maybe(File("a readable PEM file's path")), None,
            "CA certificates the brokers' certificates are checked against (`ssl`, `sasl_ssl`); unset: the "
            "system's")
    kafka_ssl_certfile = Setting("ORDERLY_KAFKA_SSL_CERTFILE", Maybe(File("a readable PEM file's path")), None,
            "client certificate chain for brokers that require one (mutual TLS); may hold the key too")
    kafka_ssl_keyfile = Setting("ORDERLY_KAFKA_SSL_KEYFILE", Maybe(File("a readable PEM file's path")), None,
            "the client certificate's private key, if not in `ORDERLY_KAFKA_SSL_CERTFILE`")
    kafka_ssl_key_password = Setting("ORDERLY_KAFKA_SSL_KEY_PASSWORD", Maybe(Hidden(Text())), None,
            "password of an encrypted client key")
    kafka_ssl_check_hostname = Setting("ORDERLY_KAFKA_SSL_CHECK_HOSTNAME", Flag(), True,
            "the broker certificate must name the host connected to (`0` only for certificates without the "
            "right names; the chain is still verified)")
    # It prefixes topic names (Kafka takes [A-Za-z0-9._-]) and is a PostgreSQL schema name.
    namespace = Setting("ORDERLY_NAMESPACE",
            Text(r"[A-Za-z][A-Za-z0-9_]*", "ASCII letters, digits and '_', starting with a letter"),
            "orderly", "topic prefix and PostgreSQL schema")
    ingest_host = Setting("ORDERLY_INGEST_HOST", Text(what="a host name or address"), "127.0.0.1",
            "ingest bind address")
    ingest_port = Setting("ORDERLY_INGEST_PORT", Port(minimum=0), 8080, "ingest port")
    append_timeout_s = Setting("ORDERLY_APPEND_TIMEOUT_S", Number(), 5.0,
            "deadline in seconds for a Kafka append before answering 503")
    read_timeout_s = Setting("ORDERLY_READ_TIMEOUT_S", Number(), 10.0,
            "a request whose body has not arrived within this many seconds gets 408 and is closed")
    processing_guarantee = Setting("ORDERLY_PROCESSING_GUARANTEE", Choice[Guarantee](get_args(Guarantee)),
            "at_least_once", "the worker's Kafka guarantee (docs/architecture.md)")
    store = Setting("ORDERLY_STORE", Choice[Store](get_args(Store)), "rocksdb",
            "the worker's state store; `memory` rebuilds all of it from the changelog at each start")
    worker_stall_s = Setting("ORDERLY_WORKER_STALL_S", Number(), 60.0,
            "a worker that decides nothing this many seconds while records wait exits (code 3) for its "
            "supervisor to restart it")
    # What the session protects: a member whose heartbeats stop this long (dead, or its event loop
    # stalled) is expelled and its partitions are given to the others; static members (below) are
    # not even expelled by a restart within it. Kafka's broker refuses a session under its
    # group.min.session.timeout.ms (6 s by default): INVALID_SESSION_TIMEOUT (docs/production.md).
    session_timeout_s = Setting("ORDERLY_SESSION_TIMEOUT_MS", Millis(minimum=1000), 10.0,
            "the consumer groups' session (worker, projector, effects, fetcher, sinks): a process that "
            "died without leaving (kill -9, a lost machine) holds its partitions this long (a worker: until the "
            "others remove it, ORDERLY_WORKER_LOST_AFTER_MS); heartbeats go "
            "every sixth of it. The brokers' group.min.session.timeout.ms must allow it "
            "(Kafka's default is 6000; `orderly dev` sets 1000), and it should be twice their "
            "broker.session.timeout.ms at least (Kafka's 9000, `orderly dev`'s 1500; a warning at start says so)")
    # The group coordinator notices a dead member only at the session's end; the workers watch each
    # other on the namespace's workers topic and remove one silent this long (app/worker/peers.py).
    worker_lost_after_s = Setting("ORDERLY_WORKER_LOST_AFTER_MS", Millis(minimum=1000, off=True), 3.0,
            "a worker whose alive records (every 250 ms, on `<namespace>.workers`) stop this long while the "
            "others' go on is removed from the group by them, and its partitions move at once instead of "
            "after ORDERLY_SESSION_TIMEOUT_MS (`0`: off). A worker stopping cleanly says so and is left to the "
            "session; one paused longer (its whole process stopped) is removed too, and joins again (a static one "
            "restarts); under a second, a few missed records would remove live ones")
    # Kafka's static membership (KIP-345): a worker that comes back under its id within the session
    # timeout gets its partitions back at once, instead of the group waiting out the dead member.
    worker_instance_id = Setting("ORDERLY_WORKER_INSTANCE_ID",
            Maybe(Text(r"[A-Za-z0-9._{}-]{1,200}", "ASCII letters, digits, '.', '_', '-' and {hostname}")), None,
            "this worker's static member id in its consumer group, unique per worker (`orderly dev` sets "
            "`worker-1`, `worker-2`, …; `{hostname}` stands for the host's name, e.g. a container's): a "
            "restarted worker takes its partitions back at once instead of after a rebalance; a worker "
            "stopped cleanly holds them for ORDERLY_SESSION_TIMEOUT_MS, one lost for ORDERLY_WORKER_LOST_AFTER_MS "
            "(the session when that is `0`). "
            "With exactly-once it also names the worker's "
            "transactional producer (`<namespace>-worker-worker-<id>`), which commits all its partitions in "
            "one transaction per commit instead of one per partition (docs/architecture.md)")
    instance_id = Setting("ORDERLY_INSTANCE_ID",
            Maybe(Text(r"[A-Za-z0-9._{}-]{1,200}", "ASCII letters, digits, '.', '_', '-' and {hostname}")), None,
            "static member id of a projector, effects worker or fetcher in its groups, unique per process of "
            "a kind (`orderly dev`: `<process>-1`; `{hostname}`: the host's name): restarted, even after kill "
            "-9, it has its partitions at once, not after the session; unset: it leaves them on a clean stop")
    worker_batch_max = Setting("ORDERLY_WORKER_BATCH", Integer(minimum=1), 1000,
            "records the worker takes and decides per batch, at most")
    worker_busy_interval_s = Setting("ORDERLY_WORKER_BUSY_INTERVAL_MS", Millis(), 0.1,
            "under load (batches of 100+), the worker's next batch waits this long, so that it grows")
    sink_busy_interval_s = Setting("ORDERLY_SINK_BUSY_INTERVAL_MS", Millis(), 0.1,
            "the same for the projector and the effects recorder")
    gc_threshold = Setting("ORDERLY_GC_THRESHOLD", Integer(minimum=0), 50_000,
            "allocations between Python's young-generation collections (`0`: Python's 700)")
    event_loop = Setting("ORDERLY_LOOP", Choice[EventLoop](get_args(EventLoop)), "uvloop",
            "event loop of every process")
    faust_loglevel = Setting("ORDERLY_FAUST_LOGLEVEL", Choice[FaustLoglevel](FAUST_LOGLEVELS), "warn",
            "log level of the worker's Faust runtime")
    debug_sinks = Setting("ORDERLY_DEBUG_SINKS", Flag(), False,
            "the projector's and effects recorder's sinks log each batch (logger `orderly.sink` at DEBUG)")
    replay_processes = Setting("ORDERLY_REPLAY_PROCESSES", Integer(minimum=0), 0,
            "processes `orderly replay` splits the partitions across (logs of 20,000+ records); `0`: one "
            "per core")
    data_dir = Setting("ORDERLY_DATA_DIR", Directory(), Path(".orderly"),
            "where `orderly dev` keeps Kafka and PostgreSQL data")
    metrics_port = Setting("ORDERLY_METRICS_PORT", Port(minimum=0), 0,
            "`/metrics` port of ingest, worker, projector, effects, fetcher (`0`: off; the admin serves it on "
            "its own port); `orderly dev` gives each a port of its own (a free port if that one is taken)")
    metrics_host = Setting("ORDERLY_METRICS_HOST", Text(what="a host name or address"), "127.0.0.1",
            "address every process's `/metrics` binds (`0.0.0.0` for a Prometheus on another host or container)")
    log_format = Setting("ORDERLY_LOG_FORMAT", Choice[LogFormat](get_args(LogFormat)), "text",
            "log lines of every process: `json` (one object a line: timestamp, level, logger, message, gateway, "
            "delivery_id, resource_id) or `text`")
    gap_backfill_after_s = Setting("ORDERLY_GAP_BACKFILL_AFTER_S", Number(), 4 * 24 * 3600.0,
            "age in seconds at which an open pg sequence gap is sent to `orderly.fetch` (the pg "
            "document: a gap open 4 days is lost)")
    effects_max_attempts = Setting("ORDERLY_EFFECTS_MAX_ATTEMPTS", Integer(minimum=1), 10,
            "delivery attempts before an effect is marked dead")
    effects_lease_s = Setting("ORDERLY_EFFECTS_LEASE_S", Number(), 30.0,
            "seconds before a claimed, undelivered effect may be claimed again")
    effects_timeout_s = Setting("ORDERLY_EFFECTS_TIMEOUT_S", Number(), 10.0, "seconds a delivery's request may take")
    # The API base of each gateway the fetcher can ask (its registry line's ``fetch``).
    api_urls = Keyed({g.name: Setting(f"ORDERLY_{g.name.upper()}_API_URL", Maybe(Url()), None, g.fetch.api_help)
                      for g in registry.GATEWAYS.values() if g.fetch})
    # The key each gateway's API takes, for those whose ``fetch`` declares one (``key_help``).
    api_keys = Keyed({g.name: Setting(f"ORDERLY_{g.name.upper()}_API_KEY", Maybe(Hidden(Text())), None,
                                      g.fetch.key_help)
                      for g in registry.GATEWAYS.values() if g.fetch and g.fetch.key_help})
    fetch_parked_after_s = Setting("ORDERLY_FETCH_PARKED_AFTER_S", Number(), 60.0,
            "a resource waiting this many seconds for a fetch (card: a parked event; stripe: a thin event or an "
            "uncertain same-second tie) is fetched from its gateway's API")
    parked_alert_after_s = Setting("ORDERLY_PARKED_ALERT_AFTER_S", Number(), 3600.0,
            "a resource parked longer than this many seconds is shown overdue to the operator (console "
            "/parked, /api/parked, orderly_parked_overdue_resources): a gateway without a fetch (adyen) waits")
    fetch_allow_http = Setting("ORDERLY_FETCH_ALLOW_HTTP", Flag(), False, "ask a gateway's API over `http://` at "
            "a host that is not loopback (off: `https://`, or `http://` to 127.0.0.1, ::1 or localhost only)")
    fetch_interval_s = Setting("ORDERLY_FETCH_INTERVAL_S", Number(), 30.0,
            "seconds between the fetcher's looks for resources waiting for a fetch")
    fetch_rate_per_s = Setting("ORDERLY_FETCH_RATE_PER_S", Number(), 10.0,
            "the fetcher's requests per second to the gateways' APIs, at most")
    sweep_after_s = Setting("ORDERLY_SWEEP_AFTER_S", Number(), 120.0,
            "a stored record with no decision this many seconds after arrival is appended again (sweeper)")
    commit_interval_s = Setting("ORDERLY_COMMIT_INTERVAL_S", Maybe(Number()), None,
            f"seconds between the worker's commits; unset: {_per_guarantee(COMMIT_INTERVAL_S)}; with "
            f"exactly-once at most {TRANSACTION_TIMEOUT_S / 2:g}")
    busy_commit_interval_s = Setting("ORDERLY_BUSY_COMMIT_INTERVAL_S", Maybe(Number()), None,
            f"the same after a commit of 250+ records; unset: {_per_guarantee(BUSY_COMMIT_INTERVAL_S)}; "
            f"with exactly-once at most {TRANSACTION_TIMEOUT_S / 2:g}")

    @property
    def heartbeat_interval_s(self) -> float:
        """A sixth of the session: a member outlives a pause of its event loop of most of the
        session (5/6 of it, minus a round trip) before the coordinator expels it."""
        return self.session_timeout_s / 6

    @property
    def instance_member(self) -> str | None:
        """A sink process's group.instance.id: ORDERLY_INSTANCE_ID with {hostname} filled in."""
        return None if self.instance_id is None else self.instance_id.replace("{hostname}", socket.gethostname())

    @property
    def worker_member(self) -> str | None:
        """The worker's group.instance.id: ORDERLY_WORKER_INSTANCE_ID with {hostname} filled in."""
        return (None if self.worker_instance_id is None
                else self.worker_instance_id.replace("{hostname}", socket.gethostname()))

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
    def from_env(cls, env: Mapping[str, str] | None = None, uses: Collection[str] | None = None) -> Settings:
        """Every setting read; every refusal reported at once (a line each), so one start says all
        that is wrong. ``uses``: the fields a process uses (app/setting_uses.py): a required setting
        outside them is not read (nor held: reading it raises AttributeError), so that no process is
        refused for a secret or a connection it does not use; an optional one is read as ever."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        errors: list[str] = []
        for row in TABLE:  # (ORDERLY_GATEWAYS, read first, refused: no secret is asked for)
            if row.field == "secrets" and row.key not in values.get("gateways", ()):
                continue
            if uses is not None and row.field not in uses and row.default is REQUIRED:
                continue
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
        values.setdefault("secrets", {})
        settings = cls._of(values)
        kafka = security_errors(settings) if "kafka_bootstrap" in values else []
        if problems := kafka + _combination_errors(settings):
            raise SettingsError("\n".join(problems))
        return settings

    @classmethod
    def _of(cls, values: Mapping[str, object]) -> Settings:
        settings = cls.__new__(cls)
        settings.__dict__.update(values)  # each shadows its Setting, a non-data descriptor
        return settings

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}: use with_overrides")

    def __eq__(self, other: object) -> bool:
        return type(other) is Settings and self.__dict__ == other.__dict__

    def __repr__(self) -> str:  # the secrets are Secret objects, masked
        return "Settings(" + ", ".join(f"{name}={value!r}" for name, value in self.__dict__.items()) + ")"

    def with_overrides(self, **changes: object) -> Settings:
        for name, value in changes.items():
            held = value.values() if isinstance(value, dict) else [value]  # secrets: a Secret per gateway
            if name not in FIELDS or (name in SECRET_FIELDS and not all(isinstance(v, Secret | None) for v in held)):
                raise TypeError(f"Settings has no setting {name!r}" if name not in FIELDS
                                else f"{name} is a secret: pass a Secret, not a {type(value).__name__}")
        return Settings._of({**self.__dict__, **changes})

    def to_env(self) -> dict[str, str]:
        """The environment that makes a child process build these same settings. Every variable is
        set, an unset one as empty, so that it also overrides what the parent's environment holds
        (a secret's ``<NAME>_FILE`` too: the value is passed itself)."""
        env = {row.env: "" if (value := row.value(self)) is None else row.kind.render(value) for row in TABLE}
        return env | {f"{row.env}_FILE": "" for row in TABLE if row.is_secret}


def _combination_errors(settings: Settings) -> list[str]:
    """Settings each valid alone but refused together (the Kafka security ones: app/kafka_client.py)."""
    problems = []
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
    return problems


# Every setting, in the order of the class (and of docs/configuration.md); the gateways' secrets one row each.
TABLE: tuple[Setting[Any], ...] = tuple(row for attribute in vars(Settings).values() for row in (
    attribute.rows if isinstance(attribute, Keyed) else [attribute] if isinstance(attribute, Setting) else []))
FIELDS = frozenset(row.field for row in TABLE)
SECRET_FIELDS = frozenset(row.field for row in TABLE if row.is_secret)
# Development defaults (docs/configuration.md's `orderly dev` column). `orderly dev` and `orderly demo` use
# them; production processes must be given real values.
DEV_DEFAULTS: dict[str, str] = {row.env: row.dev for row in TABLE if row.dev is not None}


def dev_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings for the embedded stack: the development defaults, overridden by the environment."""
    env = os.environ if env is None else env
    return Settings.from_env({**DEV_DEFAULTS, **env})
