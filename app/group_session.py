"""Whether the brokers accept the consumer groups' session, ORDERLY_SESSION_TIMEOUT_MS (I/O shell).

A group coordinator refuses a JoinGroup whose session is outside its brokers' bounds,
group.min.session.timeout.ms (6 s by default) and group.max.session.timeout.ms, with
INVALID_SESSION_TIMEOUT; aiokafka raises that from the consumer's next fetch, a traceback that
names neither bound nor setting. Every consumer of a process reads the bounds from a broker at its
start, alongside its own start (no wait added), and stops with what to change. A broker that does
not answer (not authorized to describe its configuration, say) is not a refusal: the join says.

It also warns of a session too short for the loss of a broker: the coordinator answers a heartbeat
only once the group's __consumer_offsets records are committed, which a dead follower holds up until
the controllers fence it (broker.session.timeout.ms), and a member sends its next heartbeat only
after that answer; a session under twice the brokers' has live members expelled then (seen with 3 s
against 3 s; tests/chaos/test_group_session_broker_loss.py). Only with replicated offsets: a single
broker has no follower to lose.
"""

from __future__ import annotations

import logging

from app.kafka_client import client_options
from app.settings import Settings
from topics.admin import broker_configs

log = logging.getLogger("orderly.kafka")
KAFKA_MIN_MS, KAFKA_MAX_MS = 6000, 1_800_000  # Kafka's defaults of the two bounds
KAFKA_BROKER_SESSION_MS = 9000  # Kafka's broker.session.timeout.ms


def refusal(session_ms: int, configs: dict[str, str]) -> str | None:
    """Why a broker of ``configs`` refuses a session of ``session_ms``, or None if it accepts it."""
    low = int(configs.get("group.min.session.timeout.ms") or KAFKA_MIN_MS)
    high = int(configs.get("group.max.session.timeout.ms") or KAFKA_MAX_MS)
    if low <= session_ms <= high:
        return None
    if session_ms < low:
        change = (f"set group.min.session.timeout.ms={session_ms} (or less) on every broker, or "
                  f"ORDERLY_SESSION_TIMEOUT_MS={low}: a process lost for good then holds its partitions "
                  f"{low / 1000:g} s")
    else:
        change = f"set ORDERLY_SESSION_TIMEOUT_MS to at most {high}"
    return (f"ORDERLY_SESSION_TIMEOUT_MS={session_ms} is outside the brokers' group.min.session.timeout.ms={low} .. "
            f"group.max.session.timeout.ms={high}: the group coordinator refuses every join "
            f"(INVALID_SESSION_TIMEOUT); {change} (docs/production.md)")


def fragile(session_ms: int, configs: dict[str, str]) -> str | None:
    """Why a session of ``session_ms`` may have live members expelled while a broker of ``configs``'
    cluster is fenced, or None."""
    if int(configs.get("offsets.topic.replication.factor") or 3) < 2:
        return None
    broker_ms = int(configs.get("broker.session.timeout.ms") or KAFKA_BROKER_SESSION_MS)
    if session_ms >= 2 * broker_ms:
        return None
    return (f"ORDERLY_SESSION_TIMEOUT_MS={session_ms} is under twice the brokers' broker.session.timeout.ms="
            f"{broker_ms}: while a dead broker that follows a group's __consumer_offsets partition is not yet "
            "fenced, the coordinator holds its answers to heartbeats, and a live member whose session runs out "
            f"meanwhile is expelled (a worker restarts); set ORDERLY_SESSION_TIMEOUT_MS={2 * broker_ms} or more, or "
            f"broker.session.timeout.ms={session_ms // 2} or less on the controllers and brokers (docs/production.md)")


async def broker_group_configs(settings: Settings) -> dict[str, str] | None:
    """A broker's configuration (the brokers of a cluster share the group settings), or None."""
    try:
        return await broker_configs(settings.kafka_bootstrap, **client_options(settings))
    except Exception as exc:  # not readable: the join itself will refuse or accept
        log.info("the brokers' session bounds could not be read (%r); not checked", exc)
        return None


async def session_refusal(settings: Settings) -> str | None:
    """Why the brokers refuse the groups' session, or None: accepted, or their bounds unknown."""
    configs = await broker_group_configs(settings)
    if configs is None:
        return None
    session_ms = round(settings.session_timeout_s * 1000)
    if (warning := fragile(session_ms, configs)) is not None:
        log.warning("%s", warning)
    return refusal(session_ms, configs)
