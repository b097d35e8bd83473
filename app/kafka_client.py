"""How every Kafka client of Orderly reaches the brokers: the security settings (TLS, SASL) turned
into aiokafka's options and Faust's credentials, in this one place (configuration layer, at the I/O edge).

Every producer, consumer and admin client in app/ is built with ``**client_options(settings)``
(tests/unit/test_kafka_client.py finds any that is not), the Faust worker with
``broker_credentials=faust_credentials(settings)``, and the topics package is handed the same
options as keyword arguments. Inconsistent settings are refused when the settings are read
(:func:`security_errors`, called by ``Settings.from_env``); a broker that refuses the TLS handshake
or the SASL authentication is named with its reason at start-up (:func:`refusal`, app/bootstrap.py)
instead of aiokafka's "Unable to bootstrap".

It reads the settings through :class:`KafkaSettings` and never imports app.settings, which imports
it. aiokafka and Faust are imported by the functions that use them, not at the top: every process
and CLI command imports app.settings, and they would add about 45 ms to each start.
"""

from __future__ import annotations

import asyncio
import ssl
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from app.setting_kinds import Secret, SettingsError
from app.waits import within

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

__all__ = ["SASL", "TLS", "KafkaRefusedError", "KafkaSettings", "SaslMechanism", "SecurityProtocol",
           "client_options", "faust_credentials", "refusal", "security_errors"]

SecurityProtocol = Literal["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"]
SaslMechanism = Literal["plain", "scram-sha-256", "scram-sha-512"]
SASL: tuple[SecurityProtocol, ...] = ("sasl_plaintext", "sasl_ssl")  # the protocols that authenticate with SASL
TLS: tuple[SecurityProtocol, ...] = ("ssl", "sasl_ssl")  # the protocols that speak TLS
PROTOCOL = "ORDERLY_KAFKA_SECURITY_PROTOCOL"


class KafkaSettings(Protocol):
    """The settings read here, all of them app.settings.Settings attributes; named by this protocol
    so that this module does not import app.settings, which imports it to check them."""

    @property
    def kafka_bootstrap(self) -> str: ...
    @property
    def kafka_security_protocol(self) -> SecurityProtocol: ...
    @property
    def kafka_sasl_mechanism(self) -> SaslMechanism | None: ...
    @property
    def kafka_sasl_username(self) -> str | None: ...
    @property
    def kafka_sasl_password(self) -> Secret[str] | None: ...
    @property
    def kafka_ssl_cafile(self) -> str | None: ...
    @property
    def kafka_ssl_certfile(self) -> str | None: ...
    @property
    def kafka_ssl_keyfile(self) -> str | None: ...
    @property
    def kafka_ssl_key_password(self) -> Secret[str] | None: ...
    @property
    def kafka_ssl_check_hostname(self) -> bool: ...


class KafkaRefusedError(SettingsError):
    """A broker refused these clients' TLS handshake or SASL authentication: a configuration error."""


def _sasl_rows(settings: KafkaSettings) -> dict[str, str | Secret[str] | None]:
    return {"ORDERLY_KAFKA_SASL_MECHANISM": settings.kafka_sasl_mechanism,
            "ORDERLY_KAFKA_SASL_USERNAME": settings.kafka_sasl_username,
            "ORDERLY_KAFKA_SASL_PASSWORD": settings.kafka_sasl_password}


def _tls_rows(settings: KafkaSettings) -> dict[str, str | Secret[str] | None]:
    return {"ORDERLY_KAFKA_SSL_CAFILE": settings.kafka_ssl_cafile,
            "ORDERLY_KAFKA_SSL_CERTFILE": settings.kafka_ssl_certfile,
            "ORDERLY_KAFKA_SSL_KEYFILE": settings.kafka_ssl_keyfile,
            "ORDERLY_KAFKA_SSL_KEY_PASSWORD": settings.kafka_ssl_key_password}


def _names(envs: list[str]) -> str:
    return ", ".join(envs) + (" is" if len(envs) == 1 else " are")


def security_errors(settings: KafkaSettings) -> list[str]:
    """Why the Kafka security settings cannot work together, one reason a line ([] when they can):
    SASL without its mechanism, user and password; SASL or TLS settings a plaintext protocol would
    silently ignore; a key without its certificate; a file that is missing or does not load."""
    protocol = settings.kafka_security_protocol
    errors: list[str] = []
    sasl = _sasl_rows(settings)
    if protocol in SASL:
        if missing := [env for env, value in sasl.items() if value is None]:
            errors.append(f"{PROTOCOL}={protocol} authenticates with SASL, but {_names(missing)} not set")
    elif ignored := [env for env, value in sasl.items() if value is not None]:
        errors.append(f"{_names(ignored)} set, but {PROTOCOL}={protocol} does not authenticate with SASL "
                      "(use sasl_ssl or sasl_plaintext, or unset them)")
    tls = _tls_rows(settings)
    if protocol not in TLS:
        if ignored := [env for env, value in tls.items() if value is not None]:
            errors.append(f"{_names(ignored)} set, but {PROTOCOL}={protocol} does not use TLS "
                          "(use ssl or sasl_ssl, or unset them)")
        return errors
    sasl_errors = len(errors)
    if settings.kafka_ssl_keyfile and not settings.kafka_ssl_certfile:
        errors.append("ORDERLY_KAFKA_SSL_KEYFILE is set without ORDERLY_KAFKA_SSL_CERTFILE, the client "
                      "certificate it belongs to")
    if settings.kafka_ssl_key_password and not settings.kafka_ssl_certfile:
        errors.append("ORDERLY_KAFKA_SSL_KEY_PASSWORD is set without a client certificate and key "
                      "(ORDERLY_KAFKA_SSL_CERTFILE)")
    for env, path in list(tls.items())[:3]:
        if isinstance(path, str) and not Path(path).is_file():
            errors.append(f"{env}={path!r}: no such file")
    if len(errors) == sasl_errors:  # the files are there: do they load?
        try:
            ssl_context(settings)
        except SettingsError as exc:
            errors.append(str(exc))
    return errors


def _revealed(secret: Secret[str] | None) -> str | None:
    return None if secret is None else secret.reveal()


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


@lru_cache(maxsize=8)
def _context(cafile: str | None, certfile: str | None, keyfile: str | None, key_password: str | None,
             check_hostname: bool) -> ssl.SSLContext:
    from aiokafka.helpers import create_ssl_context

    try:
        context: ssl.SSLContext = create_ssl_context(cafile=cafile)  # unset: the system's CA certificates
    except (ssl.SSLError, OSError) as exc:
        raise SettingsError(f"ORDERLY_KAFKA_SSL_CAFILE={cafile!r}: no CA certificate could be read from it, it "
                            f"takes PEM certificates ({_reason(exc)})") from None
    if certfile is not None:
        try:
            # a callable, not None: with None OpenSSL would prompt on the terminal for an encrypted key's password
            context.load_cert_chain(certfile, keyfile, key_password if key_password is not None else (lambda: b""))
        except (ssl.SSLError, OSError) as exc:
            key = f" with ORDERLY_KAFKA_SSL_KEYFILE={keyfile!r}" if keyfile else ""
            raise SettingsError(f"ORDERLY_KAFKA_SSL_CERTFILE={certfile!r}{key}: the client certificate and its "
                                f"private key do not load ({_reason(exc)}; an encrypted key needs "
                                "ORDERLY_KAFKA_SSL_KEY_PASSWORD)") from None
    context.check_hostname = check_hostname
    return context


def ssl_context(settings: KafkaSettings) -> ssl.SSLContext:
    """The TLS context of every client (one per distinct setting, shared): the brokers' chain is
    verified against ORDERLY_KAFKA_SSL_CAFILE (else the system's CAs), their names checked unless
    ORDERLY_KAFKA_SSL_CHECK_HOSTNAME is off, the client certificate presented when one is set."""
    return _context(settings.kafka_ssl_cafile, settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile,
                    _revealed(settings.kafka_ssl_key_password), settings.kafka_ssl_check_hostname)


def client_options(settings: KafkaSettings) -> dict[str, Any]:
    """The keyword arguments of aiokafka's producers, consumers and admin clients that say how to
    reach the brokers (``security_protocol``, ``ssl_context``, ``sasl_*``)."""
    protocol = settings.kafka_security_protocol
    options: dict[str, Any] = {"security_protocol": protocol.upper()}
    if protocol in TLS:
        options["ssl_context"] = ssl_context(settings)
    if protocol in SASL:
        # aiokafka takes the user and password under these names for SCRAM as well as for PLAIN
        options.update(sasl_mechanism=(settings.kafka_sasl_mechanism or "").upper(),
                       sasl_plain_username=settings.kafka_sasl_username,
                       sasl_plain_password=_revealed(settings.kafka_sasl_password))
    return options


def faust_credentials(settings: KafkaSettings) -> CredentialsT | None:
    """Faust's ``broker_credentials`` for the same settings. Faust's aiokafka driver turns them into
    the options above for its consumer, its producers (transactional ones too) and its admin calls
    (faust/transport/drivers/aiokafka.py, credentials_to_aiokafka_auth): SASLCredentials gives
    SASL_SSL when it has an SSL context, SASL_PLAINTEXT without, with its mechanism (SCRAM too)."""
    import faust

    protocol = settings.kafka_security_protocol
    if protocol == "plaintext":
        return None
    if protocol == "ssl":
        return faust.SSLCredentials(ssl_context(settings))
    return faust.SASLCredentials(
        username=settings.kafka_sasl_username, password=_revealed(settings.kafka_sasl_password),
        mechanism=(settings.kafka_sasl_mechanism or "").upper(),
        ssl_context=ssl_context(settings) if protocol == "sasl_ssl" else None)


def _tls_hint(exc: ssl.SSLError, settings: KafkaSettings) -> str:
    if "ALERT" in (exc.reason or ""):  # the broker's answer: it refused this client's certificate, or its absence
        return ("the broker requires a client certificate (mutual TLS) signed by a CA it trusts: "
                "ORDERLY_KAFKA_SSL_CERTFILE and ORDERLY_KAFKA_SSL_KEYFILE")
    return ("the broker's certificate must be signed by a CA in ORDERLY_KAFKA_SSL_CAFILE (unset: the system's) and "
            "name the host connected to (ORDERLY_KAFKA_SSL_CHECK_HOSTNAME), and its listener must speak TLS "
            f"({PROTOCOL}={settings.kafka_security_protocol})")


def _hosts(bootstrap: str) -> list[tuple[str, int]]:
    hosts = []
    for part in bootstrap.split(","):
        host, _, port = part.strip().rpartition(":")
        if host and port.isdigit():
            hosts.append((host.strip("[]"), int(port)))
    return hosts


async def refusal(settings: KafkaSettings, timeout_s: float = 10.0) -> KafkaRefusedError | None:
    """Why the bootstrap brokers refuse these clients, when that is the reason they cannot be
    reached: the first broker that answers but fails the TLS handshake or the SASL authentication
    (a CA that did not sign its certificate, a wrong password, a mechanism it does not enable).
    None when a broker accepts them, or none answers at all (Kafka is down: not a configuration
    error, the caller's own error stands)."""
    from aiokafka import errors
    from aiokafka.conn import create_conn
    from aiokafka.protocol.metadata import MetadataRequest

    refused = (errors.SaslAuthenticationFailed, errors.UnsupportedSaslMechanismError,
               errors.IllegalSaslStateError, errors.AuthenticationFailedError)
    user = (f"user {settings.kafka_sasl_username!r} with {(settings.kafka_sasl_mechanism or '').upper()}"
            if settings.kafka_security_protocol in SASL else "")
    closed_on_us: tuple[str, int] | None = None
    for host, port in _hosts(settings.kafka_bootstrap):
        try:
            conn = await create_conn(host, port, request_timeout_ms=int(timeout_s * 1000), **client_options(settings))
        except refused as exc:
            return KafkaRefusedError(
                f"Kafka at {host}:{port} refused the SASL authentication of {user}: {_reason(exc)}; check "
                "ORDERLY_KAFKA_SASL_USERNAME, ORDERLY_KAFKA_SASL_PASSWORD and ORDERLY_KAFKA_SASL_MECHANISM")
        except (ssl.SSLError, errors.KafkaConnectionError) as exc:
            # the broker's alert after the handshake (a client certificate refused) closes the connection
            tls = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
            if isinstance(tls, ssl.SSLError):
                return KafkaRefusedError(f"the TLS handshake with Kafka at {host}:{port} failed: {_reason(tls)}; "
                                         + _tls_hint(tls, settings))
            if closed_on_us is None and await _accepts(host, port):
                closed_on_us = (host, port)  # up, but it hung up on what these clients speak
            continue  # not answering: the next one may
        except (TimeoutError, OSError, errors.KafkaError):
            continue
        try:  # the handshake went through: does it answer a request (SASL listeners close on one)?
            await within(conn.send(MetadataRequest([])), timeout_s)
        except (TimeoutError, OSError, errors.KafkaError):
            if closed_on_us is None:
                closed_on_us = (host, port)
            continue
        finally:
            conn.close()
        return None
    if closed_on_us is not None:
        host, port = closed_on_us
        return KafkaRefusedError(
            f"Kafka at {host}:{port} accepts connections but closed this client's without an answer: its listener "
            f"speaks another protocol than {PROTOCOL}={settings.kafka_security_protocol} (plaintext, ssl, "
            "sasl_plaintext or sasl_ssl: ask for the listener's security protocol)")
    return None


async def _accepts(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """A TCP connection to host:port is accepted (something listens there)."""
    try:
        _reader, writer = await within(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True
