"""`orderly check`: the settings of the processes named checked without connecting, then Kafka,
PostgreSQL and each configured URL reached; and the one line a command prints when a connection
fails (operator command and start-up checks; DESIGN.md §6, docs/configuration.md).

Every process runs the same setting checks at start (app/cli.py): :func:`start_checks` are the
ones a process ran only once it had connected before, moved ahead of any connection.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from app.setting_kinds import REQUIRED, Setting, SettingsError
from app.setting_uses import PROCESSES, USES, uses
from app.settings import TABLE, Settings
from app.waits import within

DEADLINE_S = 5.0  # each reach: a check that hangs tells an operator less than one that fails
KAFKA, POSTGRES = Settings.kafka_bootstrap, Settings.postgres_dsn
DISCOVERY = "/.well-known/openid-configuration"  # OpenID Connect Discovery 1.0, §4


@dataclass(frozen=True)
class Line:
    """One check's outcome: ``ok ORDERLY_X …`` or ``fail …`` (a refusal names its variable itself)."""

    ok: bool
    text: str

    def __str__(self) -> str:
        return f"{'ok' if self.ok else 'fail'} {self.text}"


def without_password(text: str) -> str:
    """``text`` with a URL's password (``https://user:password@host/…``, basic auth) as ``***``."""
    try:
        parts = urlsplit(text)
        if parts.password is None:
            return text
    except ValueError:
        return text
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit((parts.scheme, f"{user.partition(':')[0]}:***@{host}", parts.path, parts.query, parts.fragment))


def _shown(row: Setting[Any], env: Mapping[str, str], value: object) -> str:
    """What an ok line says of a value: a secret only its length, never a character of it."""
    if value is None:
        return f"{row.env} unset"
    if row.is_secret:
        return f"{row.env} set ({len(row.text(env))} chars)"
    default = " (default)" if row.text(env) == "" else ""
    return f"{row.env} = {without_password(row.kind.render(value))}{default}"


def setting_lines(env: Mapping[str, str], fields: frozenset[str]) -> list[Line]:
    """A line for each setting ``fields`` take and for each other one set (a process reads those
    too), in docs/configuration.md's order; a gateway's secret for the enabled gateways only."""
    lines: list[Line] = []
    enabled: tuple[str, ...] = ()
    for row in TABLE:
        if row.field == "secrets" and row.key not in enabled:
            continue
        if row.field not in fields and (row.default is REQUIRED or not (env.get(row.env)
                                                                         or env.get(f"{row.env}_FILE"))):
            continue
        try:
            value = row.read(env)
        except SettingsError as exc:
            lines.append(Line(False, str(exc)))
            continue
        if row.field == "gateways":
            enabled = value
        lines.append(Line(True, _shown(row, env, value)))
    return lines  # (ORDERLY_GATEWAYS refused: no secret asked for, as from_env does)


def with_page(problem: str) -> str:
    """``problem`` ending with the row of docs/configuration.md of the first variable it names, unless
    it names a page already (a refusal of two settings together is said where they are checked)."""
    if "docs/" in problem or not (name := re.search(r"ORDERLY_[A-Z0-9_]*[A-Z0-9]", problem)):
        return problem
    return f"{problem} (docs/configuration.md#{name.group().removesuffix('_FILE').lower()})"


def start_checks(process: str, settings: Settings) -> None:
    """What ``process`` refuses besides each setting alone, checked before it connects anywhere:
    the admin's sign-in, the effects' signed https delivery, the fetcher's https APIs. Raises
    SettingsError."""
    if process == "admin":
        from app.admin.context import Admin

        Admin.check(settings)
    if process == "effects":
        from app.effects import delivery_key

        delivery_key(settings)
    if process == "fetcher":
        from app.fetcher import check_api_urls

        check_api_urls(settings)


def settings_of(env: Mapping[str, str], processes: tuple[str, ...]) -> tuple[Settings | None, list[Line]]:
    """The settings ``processes`` use, with a line for each; None when one is refused."""
    lines = setting_lines(env, uses(*processes))
    if not all(line.ok for line in lines):
        return None, lines
    try:
        settings = Settings.from_env(env, uses(*processes))
        for process in processes or tuple(PROCESSES):
            start_checks(process, settings)
    except SettingsError as exc:
        return None, [*lines, *(Line(False, with_page(problem)) for problem in str(exc).split("\n"))]
    return settings, lines


async def reach_kafka(settings: Settings) -> Line:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    from app.kafka_client import client_options, refusal

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=int(DEADLINE_S * 1000),
                                **client_options(settings))
    try:
        await within(admin.start(), DEADLINE_S * 2)
        brokers = len((await within(admin.describe_cluster(), DEADLINE_S))["brokers"])
    except (TimeoutError, KafkaError, OSError) as exc:
        refused = await refusal(settings, DEADLINE_S)
        return Line(False, str(refused) if refused else kafka_down(exc))
    finally:
        await admin.close()
    return Line(True, f"{KAFKA.env} reached ({brokers} broker{'s' if brokers != 1 else ''})")


async def reach_postgres(settings: Settings) -> Line:
    import asyncpg

    try:
        conn = await asyncpg.connect(settings.postgres_dsn.reveal(), timeout=DEADLINE_S)
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return Line(False, postgres_down(exc))
    try:
        version = conn.get_server_version()
    finally:
        await conn.close()
    return Line(True, f"{POSTGRES.env} reached (PostgreSQL {version.major}.{version.minor})")


async def reach_url(variable: str, url: str, page: str) -> Line:
    """Any HTTP answer counts (an effects endpoint may answer a GET 405), but for an issuer's
    discovery document, which must be there (200); no answer in time does not."""
    import aiohttp

    shown = without_password(url)
    timeout = aiohttp.ClientTimeout(total=DEADLINE_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url, allow_redirects=False) as resp:
            if url.endswith(DISCOVERY) and resp.status != 200:
                return Line(False, f"{variable}: {shown} answered HTTP {resp.status}, not the issuer's discovery "
                                   f"document; is {variable} the issuer's URL? ({page})")
            return Line(True, f"{variable} reached (HTTP {resp.status})")
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        reason = str(exc) or type(exc).__name__
        return Line(False, f"{variable}: {shown} was not reached (deadline {DEADLINE_S:g} s): {reason}; is it up, and "
                           f"is {variable} its address? ({page})")


def _urls(settings: Settings, fields: frozenset[str]) -> list[tuple[str, str, str]]:
    """(variable, URL to ask, page) of every URL the processes use that is set."""
    found = []
    for row in TABLE:
        if row.field in fields and row.field in ("effects_url", "api_urls", "admin_oidc_issuer"):
            url = row.value(settings)
            if isinstance(url, str):
                if row.field == "admin_oidc_issuer":
                    url = url.rstrip("/") + DISCOVERY
                found.append((row.env, url, row.page))
    return found


async def reach(settings: Settings, fields: frozenset[str]) -> list[Line]:
    """Kafka, PostgreSQL and each URL, all at once (each under its own deadline)."""
    checks = [reach_kafka(settings)] if KAFKA.field in fields else []
    checks += [reach_postgres(settings)] if POSTGRES.field in fields else []
    checks += [reach_url(*url) for url in _urls(settings, fields)]
    return list(await asyncio.gather(*checks))


def run(processes: list[str], env: Mapping[str, str]) -> int:
    """`orderly check [PROCESS …]`: a line per check on stdout; 0 only if every one passed, else 2."""
    if unknown := [p for p in processes if p not in USES]:
        print(f"orderly check: no process or command {', '.join(unknown)}; one of {', '.join(USES)}", file=sys.stderr)
        return 2
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # its failure is a line of ours
    settings, lines = settings_of(env, tuple(processes))
    if settings is not None:
        lines += asyncio.run(reach(settings, uses(*processes)))
    for line in lines:
        print(line)
    failed = sum(not line.ok for line in lines)
    print(f"{len(lines) - failed} ok, {failed} failed" + ("" if settings else " (nothing reached: settings first)"))
    return 0 if failed == 0 else 2


def kafka_down(exc: BaseException) -> str:
    return (f"{KAFKA.env}: Kafka did not answer: {str(exc) or type(exc).__name__}; is it running, and does "
            f"{KAFKA.env} name its brokers? ({KAFKA.page})")


def postgres_down(exc: BaseException) -> str:
    import asyncpg

    if isinstance(exc, asyncpg.PostgresError):  # it answered, and said no (a password, a database)
        return f"{POSTGRES.env}: PostgreSQL refused the connection: {exc}; correct the DSN ({POSTGRES.page})"
    reason = str(exc) or type(exc).__name__
    return (f"{POSTGRES.env}: PostgreSQL did not answer: {reason}; is it running, and does {POSTGRES.env} name "
            f"it? ({POSTGRES.page})")


def failure_line(exc: BaseException) -> str | None:
    """The one line a command ends with when Kafka or PostgreSQL cannot be reached (None for any
    other error, whose traceback is worth having). asyncpg raises the socket's own OSError, so an
    OSError counts as PostgreSQL's when asyncpg's code raised it."""
    from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

    if isinstance(exc, KafkaConnectionError | KafkaTimeoutError):
        return kafka_down(exc)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").startswith("asyncpg."):
            import asyncpg

            if isinstance(exc, OSError | asyncio.TimeoutError | asyncpg.PostgresError | asyncpg.InterfaceError):
                return postgres_down(exc)
            return None
        tb = tb.tb_next
    return None
