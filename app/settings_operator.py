"""Settings for the commands an operator runs by hand next to an `orderly dev` (configuration layer):
the stack's addresses and random credentials from its ``stack.json`` when the environment lacks them."""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path

from app.settings import Settings, SettingsError, dev_settings


def stack_credentials(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The random credentials of the `orderly dev` or `orderly demo` running next to this command
    (its ``stack.json``, app/stack/credentials.py); none when there is none."""
    env = os.environ if env is None else env
    try:
        found = json.loads((Path(env.get("ORDERLY_DATA_DIR") or ".orderly") / "stack.json").read_text())
        return {str(k): str(v) for k, v in dict(found.get("credentials") or {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def operator_settings(env: Mapping[str, str] | None = None, uses: Collection[str] | None = None) -> Settings:
    """Settings for a command an operator runs by hand (using ``uses``, as from_env): from the
    environment, or — when it lacks the Kafka or the PostgreSQL the command uses — from the
    ``stack.json`` of an `orderly dev` running next to it (in ``ORDERLY_DATA_DIR``, default
    ``.orderly``), with the development defaults for the rest."""
    env = os.environ if env is None else env
    wanted = [r.env for r in (Settings.kafka_bootstrap, Settings.postgres_dsn) if uses is None or r.field in uses]
    if all(env.get(v) or env.get(f"{v}_FILE") for v in wanted):
        return Settings.from_env(env, uses)
    stack_file = Path(env.get("ORDERLY_DATA_DIR") or ".orderly") / "stack.json"
    try:
        stack = json.loads(stack_file.read_text())
        found = {"ORDERLY_KAFKA": str(stack["kafka_bootstrap"]), "ORDERLY_POSTGRES_DSN": str(stack["postgres_dsn"])}
        if stack.get("namespace") and not env.get("ORDERLY_NAMESPACE"):
            found["ORDERLY_NAMESPACE"] = str(stack["namespace"])
        found = {**stack_credentials(env), **env, **found}  # the environment's own credentials first
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return Settings.from_env(env, uses)
        except SettingsError as exc:
            first, *more = str(exc).split("\n")
            raise SettingsError("\n".join([f"{first} (and no running `orderly dev` was found: {stack_file} is "
                                            "missing or unreadable)", *more])) from None
    return dev_settings({**env, **found})
