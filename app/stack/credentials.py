"""Credentials of one embedded stack: random, made when `orderly dev` or `orderly demo` starts (embedded stack layer).

No stack runs on a credential anyone can read in the repository: the break-glass admin token, the
correlation API token, the effects signing secret and every gateway's signing secret are drawn
from ``secrets`` for each stack, unless the environment sets them. They are printed once and kept
in ``.orderly/stack.json`` (written mode 0600, app/supervisor.py), where `orderly simulate` and the
operator commands find them (app/settings_operator.stack_credentials). docs/configuration.md's `orderly dev`
column keeps the shapes the unit tests build settings with; a stack never uses those values.
"""

from __future__ import annotations

import base64
import secrets
import string
from collections.abc import Mapping

from app.settings import DEV_DEFAULTS, TABLE, Settings, dev_settings

ADMIN_TOKEN = "ORDERLY_ADMIN_TOKEN"
NOT_CREDENTIALS = frozenset({"ORDERLY_POSTGRES_DSN"})  # hidden (it may hold a password), but the stack's own address


def credential_names() -> tuple[str, ...]:
    """The variables a stack makes: the break-glass token, and every hidden setting with a
    development value (the correlation token, the effects secret, each gateway's secret)."""
    made = [row.env for row in TABLE if row.is_secret and row.dev is not None and row.env not in NOT_CREDENTIALS]
    return (ADMIN_TOKEN, *made)


def like(example: str) -> str:
    """A random value of the shape ``example`` has, so that the setting's own check accepts it:
    ``whsec_`` and base64 (Standard Webhooks), hex of the same length (Adyen's HMAC key), else a
    random token (256 bits each)."""
    if example.startswith("whsec_"):
        return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    if len(example) >= 32 and all(c in string.hexdigits for c in example):
        return secrets.token_hex(len(example) // 2).upper()
    return secrets.token_urlsafe(32)


def generate(env: Mapping[str, str]) -> dict[str, str]:
    """Random credentials for those of :func:`credential_names` that ``env`` does not name (one it
    names empty stays empty: a gateway left out, say)."""
    return {name: secrets.token_urlsafe(32) if name == ADMIN_TOKEN else like(DEV_DEFAULTS[name])
            for name in credential_names() if name not in env}


def stack_settings(env: Mapping[str, str]) -> tuple[Settings, dict[str, str]]:
    """The settings of a new stack: the development defaults, this stack's random credentials over
    them, the environment (``env``) over both; and the credentials made (to be printed)."""
    made = generate(env)
    return dev_settings({**made, **env}), made


def of(settings: Settings) -> dict[str, str]:
    """The credentials ``settings`` hold, as variables (what stack.json keeps)."""
    rendered = settings.to_env()
    return {name: rendered[name] for name in credential_names() if rendered.get(name)}


def announce(made: Mapping[str, str], stack_file: object) -> str:
    """What `orderly dev` and `orderly demo` print about the credentials they made."""
    lines = [f"  {name}={value}" for name, value in made.items()]
    return (f"credentials made for this stack (also in {stack_file}, mode 0600, under \"credentials\"):\n"
            + "\n".join(lines)) if lines else "credentials: all from the environment"
