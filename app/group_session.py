"""Whether the brokers accept the consumer groups' session, ORDERLY_SESSION_TIMEOUT_MS (I/O shell).

A group coordinator refuses a JoinGroup whose session is outside its brokers' bounds,
group.min.session.timeout.ms (6 s by default) and group.max.session.timeout.ms, with
INVALID_SESSION_TIMEOUT; aiokafka raises that from the consumer's next fetch, a traceback that
names neither bound nor setting. Every consumer of a process reads the bounds from a broker at its
start, alongside its own start (no wait added), and stops with what to change. A broker that does
not answer (not authorized to describe its configuration, say) is not a refusal: the join says.
"""

from __future__ import annotations

import logging

from app.kafka_client import client_options
from app.settings import Settings
from topics.admin import broker_configs

log = logging.getLogger("orderly.kafka")
KAFKA_MIN_MS, KAFKA_MAX_MS = 6000, 1_800_000  # Kafka's defaults of the two bounds


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
    return None if configs is None else refusal(round(settings.session_timeout_s * 1000), configs)
