"""Which settings each process and command uses (configuration layer).

One table, read three ways: a process requires only the required settings it uses
(:meth:`app.settings.Settings.from_env`'s ``uses``), `orderly check PROCESS` checks exactly these,
and the Helm chart gives each container exactly these (tests/integration/test_helm_chart.py).
tests/unit/test_setting_uses.py holds the table to the code: for every production process it is
what the modules its command imports name (``settings.<field>``), no more and no less.
"""

from __future__ import annotations

# How any client reaches Kafka (app/kafka_client.py)
KAFKA = frozenset({"kafka_bootstrap", "kafka_security_protocol", "kafka_sasl_mechanism", "kafka_sasl_username",
                   "kafka_sasl_password", "kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile",
                   "kafka_ssl_key_password", "kafka_ssl_check_hostname"})
# The topics' names and settings, and what the gateways' registry names, which every Kafka user imports
TOPICS = frozenset({"namespace", "replication_factor", "min_insync_replicas", "processing_guarantee",
                    "commit_interval_s", "busy_commit_interval_s", "adyen_basic_auth", "partitions",
                    "raw_retention_ms"})
# What app/cli.py's `_process` reads before any production process runs
PROCESS = frozenset({"postgres_dsn", "gc_threshold", "event_loop", "debug_sinks", "log_format"})
METRICS = frozenset({"metrics_port", "metrics_host"})
SINK = frozenset({"instance_id", "sink_busy_interval_s", "session_timeout_s"})
EFFECTS = frozenset({"effects_url", "effects_secret", "effects_allow_http", "effects_concurrency",
                     "effects_max_attempts", "effects_lease_s", "effects_timeout_s"})
WORKER = frozenset({"store", "worker_stall_s", "worker_instance_id", "worker_batch_max", "worker_busy_interval_s",
                    "faust_loglevel", "data_dir", "session_timeout_s",
                    "worker_lost_after_s"})
ADMIN = frozenset({"admin_token", "admin_oidc_issuer", "admin_oidc_client_id", "admin_oidc_client_secret",
                   "admin_oidc_redirect_url", "admin_roles_claim", "admin_role_map", "admin_session_idle_s",
                   "admin_session_max_s", "admin_trusted_proxies", "admin_host", "admin_port"})

# The production processes (one container each in the Helm chart), `orderly check`'s default
PROCESSES: dict[str, frozenset[str]] = {
    "ingest": KAFKA | TOPICS | PROCESS | METRICS | {"gateways", "secrets", "api_token", "ingest_host", "ingest_port",
                                                   "append_timeout_s", "read_timeout_s"},
    "worker": KAFKA | TOPICS | PROCESS | METRICS | WORKER,
    "projector": KAFKA | TOPICS | PROCESS | METRICS | SINK | {"gap_backfill_after_s", "parked_alert_after_s"},
    "effects": KAFKA | TOPICS | PROCESS | METRICS | SINK | EFFECTS,
    # with the sweeper (app/sweeper.py), which runs inside the fetcher
    "fetcher": KAFKA | TOPICS | PROCESS | METRICS | SINK | EFFECTS | {
        "gateways", "api_urls", "api_keys", "fetch_parked_after_s", "fetch_allow_http", "fetch_interval_s",
        "fetch_rate_per_s", "sweep_after_s"},
    "admin": KAFKA | TOPICS | PROCESS | METRICS | ADMIN | {
        "gateways", "effects_url", "effects_lease_s", "gap_backfill_after_s", "api_urls", "fetch_parked_after_s",
        "parked_alert_after_s"},
    "migrate": KAFKA | TOPICS | {"postgres_dsn"},
}
# The commands an operator runs: PostgreSQL's view alone, or Kafka as well where they append
# (a redrive, a replay, an export)
READS = frozenset({"postgres_dsn", "namespace"})
COMMANDS: dict[str, frozenset[str]] = {
    "parked": READS, "inspect": READS, "gaps": READS, "reconcile": READS, "admin token": READS,
    "quarantine": KAFKA | TOPICS | READS,
    "effects list": READS,
    "replay": KAFKA | TOPICS | READS | WORKER | METRICS | {"gc_threshold", "log_format", "replay_processes"},
    "export": KAFKA | TOPICS,
}
USES: dict[str, frozenset[str]] = {**PROCESSES, **COMMANDS}


def uses(*names: str) -> frozenset[str]:
    """The fields ``names`` use together (every production process's when none is named); a name
    that is no process or command is a KeyError."""
    return frozenset().union(*(USES[name] for name in names or PROCESSES))
