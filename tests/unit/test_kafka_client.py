"""Kafka security settings (app/kafka_client.py): every Kafka client of app/ and bench/ gets them,
they become the aiokafka options and the Faust credentials that say the same, and inconsistent ones
are refused when the settings are read, with the reason and never the secret."""

from __future__ import annotations

import ast
import ssl
from pathlib import Path

import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from app.kafka_client import client_options, faust_credentials
from app.settings import DEV_DEFAULTS, Settings, SettingsError
from tests import parsing
from tests.kafka_security import Pki, ca_names, issue, make_ca

ROOT = Path(__file__).resolve().parents[2]
# Constructions that open Kafka connections: each must be handed how to reach the brokers
# (``**client_options(settings)``, or the ``**client`` its own caller was handed).
CLIENTS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient", "KeyedProducer", "Liveness", "Appender",
           "ensure_topics", "topic_configs"}
FAUST_APPS = {"WorkerApp", "App"}  # Faust's app takes broker_credentials instead


def _name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def unsecured_clients(source: str, filename: str) -> list[str]:
    """``file:line name`` of each Kafka client construction in ``source`` that is not handed the
    security options."""
    found = []
    for node in ast.walk(parsing.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node)
        if name in CLIENTS and not any(k.arg is None for k in node.keywords):
            found.append(f"{filename}:{node.lineno} {name}")
        if name in FAUST_APPS and any(k.arg == "broker" for k in node.keywords) \
                and not any(k.arg == "broker_credentials" for k in node.keywords):
            found.append(f"{filename}:{node.lineno} {name} without broker_credentials")
    return found


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return issue(issue(make_ca(tmp_path_factory.mktemp("pki")), "broker"), "client")


def settings(**env: str) -> Settings:
    return Settings.from_env({**DEV_DEFAULTS, **env})


def sasl_ssl(pki: Pki, mechanism: str = "scram-sha-512", **env: str) -> Settings:
    return settings(ORDERLY_KAFKA_SECURITY_PROTOCOL="sasl_ssl", ORDERLY_KAFKA_SASL_MECHANISM=mechanism,
                    ORDERLY_KAFKA_SASL_USERNAME="orderly", ORDERLY_KAFKA_SASL_PASSWORD="s3cret-never-shown",
                    ORDERLY_KAFKA_SSL_CAFILE=str(pki.ca), **env)


def test_every_kafka_client_in_app_and_bench_is_handed_the_security_options() -> None:
    files = sorted([*(ROOT / "app").rglob("*.py"), *(ROOT / "bench").rglob("*.py")])
    offenders = [o for path in files for o in unsecured_clients(path.read_text(), str(path.relative_to(ROOT)))]
    assert offenders == []


def test_the_scan_finds_a_client_built_without_them() -> None:
    source = """
producer = KeyedProducer(settings.kafka_bootstrap, linger_ms=0)
consumer = aiokafka.AIOKafkaConsumer("t", bootstrap_servers=b, **client_options(settings))
admin = AIOKafkaAdminClient(bootstrap_servers=b)
app = faust.App("x", broker="kafka://b")
secured = WorkerApp("x", broker="kafka://b", broker_credentials=faust_credentials(settings))
created = await ensure_topics(b, specs)
"""
    assert unsecured_clients(source, "m.py") == [
        "m.py:2 KeyedProducer", "m.py:4 AIOKafkaAdminClient", "m.py:5 App without broker_credentials",
        "m.py:7 ensure_topics"]


def test_plaintext_is_the_default() -> None:
    s = settings()
    assert s.kafka_security_protocol == "plaintext"
    assert client_options(s) == {"security_protocol": "PLAINTEXT"}
    assert faust_credentials(s) is None


@pytest.mark.parametrize("mechanism", ["plain", "SCRAM-SHA-256", "scram-sha-512"])
def test_sasl_ssl_verifies_the_broker_against_the_ca_and_faust_gets_the_same(pki: Pki, mechanism: str) -> None:
    s = sasl_ssl(pki, mechanism)
    options = client_options(s)
    context = options.pop("ssl_context")
    assert options == {"security_protocol": "SASL_SSL", "sasl_mechanism": mechanism.upper(),
                       "sasl_plain_username": "orderly", "sasl_plain_password": "s3cret-never-shown"}
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert ca_names(context) == ["orderly test CA"]  # only the CA of the setting, not the system's
    # Faust's aiokafka driver turns the credentials into the same options for its own clients
    assert credentials_to_aiokafka_auth(faust_credentials(s)) == client_options(s)


def test_sasl_plaintext_has_no_tls(pki: Pki) -> None:
    s = settings(ORDERLY_KAFKA_SECURITY_PROTOCOL="sasl_plaintext", ORDERLY_KAFKA_SASL_MECHANISM="scram-sha-256",
                 ORDERLY_KAFKA_SASL_USERNAME="u", ORDERLY_KAFKA_SASL_PASSWORD="p")
    assert client_options(s) == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                                 "sasl_plain_username": "u", "sasl_plain_password": "p"}
    assert credentials_to_aiokafka_auth(faust_credentials(s)) == {**client_options(s), "ssl_context": None}


def test_ssl_with_a_client_certificate_and_without_the_hostname_check(pki: Pki) -> None:
    s = settings(ORDERLY_KAFKA_SECURITY_PROTOCOL="ssl", ORDERLY_KAFKA_SSL_CAFILE=str(pki.ca),
                 ORDERLY_KAFKA_SSL_CERTFILE=str(pki.cert("client")), ORDERLY_KAFKA_SSL_KEYFILE=str(pki.key("client")),
                 ORDERLY_KAFKA_SSL_CHECK_HOSTNAME="0")
    options = client_options(s)
    assert set(options) == {"security_protocol", "ssl_context"} and options["security_protocol"] == "SSL"
    assert not options["ssl_context"].check_hostname and options["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert credentials_to_aiokafka_auth(faust_credentials(s)) == options
    # certificate and key in one file
    bundled = settings(ORDERLY_KAFKA_SECURITY_PROTOCOL="ssl", ORDERLY_KAFKA_SSL_CERTFILE=str(pki.bundle("client")))
    assert client_options(bundled)["security_protocol"] == "SSL"


def test_secured_settings_round_trip_through_a_childs_environment(pki: Pki) -> None:
    s = sasl_ssl(pki, ORDERLY_KAFKA_SSL_CERTFILE=str(pki.cert("client")),
                 ORDERLY_KAFKA_SSL_KEYFILE=str(pki.key("client")), ORDERLY_KAFKA_SSL_CHECK_HOSTNAME="false")
    assert Settings.from_env(s.to_env()) == s
    assert s.to_env()["ORDERLY_KAFKA_SASL_MECHANISM"] == "scram-sha-512"


def refusal(env: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as refused:
        settings(**env)
    return str(refused.value)


SASL_SSL = {"ORDERLY_KAFKA_SECURITY_PROTOCOL": "sasl_ssl"}
A_FILE = __file__  # a file that is there and readable (a path that is not is refused by the row alone)


@pytest.mark.parametrize(("env", "reason"), [
    ({**SASL_SSL, "ORDERLY_KAFKA_SASL_MECHANISM": "plain"},
     "ORDERLY_KAFKA_SECURITY_PROTOCOL=sasl_ssl authenticates with SASL, but ORDERLY_KAFKA_SASL_USERNAME, "
     "ORDERLY_KAFKA_SASL_PASSWORD are not set"),
    ({"ORDERLY_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext", "ORDERLY_KAFKA_SASL_USERNAME": "u",
      "ORDERLY_KAFKA_SASL_PASSWORD": "s3cret-never-shown"},
     "ORDERLY_KAFKA_SECURITY_PROTOCOL=sasl_plaintext authenticates with SASL, but ORDERLY_KAFKA_SASL_MECHANISM is "
     "not set"),
    ({"ORDERLY_KAFKA_SASL_USERNAME": "u", "ORDERLY_KAFKA_SASL_PASSWORD": "s3cret-never-shown"},
     "ORDERLY_KAFKA_SASL_USERNAME, ORDERLY_KAFKA_SASL_PASSWORD are set, but ORDERLY_KAFKA_SECURITY_PROTOCOL="
     "plaintext does not authenticate with SASL"),
    ({"ORDERLY_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext", "ORDERLY_KAFKA_SASL_MECHANISM": "plain",
      "ORDERLY_KAFKA_SASL_USERNAME": "u", "ORDERLY_KAFKA_SASL_PASSWORD": "p", "ORDERLY_KAFKA_SSL_CAFILE": A_FILE},
     "ORDERLY_KAFKA_SSL_CAFILE is set, but ORDERLY_KAFKA_SECURITY_PROTOCOL=sasl_plaintext does not use TLS"),
    ({"ORDERLY_KAFKA_SECURITY_PROTOCOL": "ssl", "ORDERLY_KAFKA_SSL_CAFILE": "/nowhere/ca.pem"},
     "ORDERLY_KAFKA_SSL_CAFILE='/nowhere/ca.pem': no such file"),
    ({"ORDERLY_KAFKA_SECURITY_PROTOCOL": "ssl", "ORDERLY_KAFKA_SSL_KEYFILE": A_FILE},
     "ORDERLY_KAFKA_SSL_KEYFILE is set without ORDERLY_KAFKA_SSL_CERTFILE"),
    ({"ORDERLY_KAFKA_SECURITY_PROTOCOL": "ssl", "ORDERLY_KAFKA_SSL_KEY_PASSWORD": "s3cret-never-shown"},
     "ORDERLY_KAFKA_SSL_KEY_PASSWORD is set without a client certificate"),
    ({"ORDERLY_KAFKA_SECURITY_PROTOCOL": "tls"},
     "ORDERLY_KAFKA_SECURITY_PROTOCOL='tls': not one of them; it takes one of plaintext, ssl, sasl_plaintext, "
     "sasl_ssl"),
    ({**SASL_SSL, "ORDERLY_KAFKA_SASL_MECHANISM": "gssapi"},
     "ORDERLY_KAFKA_SASL_MECHANISM='gssapi': not one of them; it takes one of plain, scram-sha-256, scram-sha-512"),
], ids=["no user", "no mechanism", "sasl on plaintext", "tls file on sasl_plaintext", "missing ca", "key alone",
        "key password alone", "unknown protocol", "unknown mechanism"])
def test_inconsistent_settings_are_refused_with_the_reason(env: dict[str, str], reason: str) -> None:
    message = refusal(env)
    assert reason in message
    assert "s3cret-never-shown" not in message


def test_a_ca_file_that_does_not_parse_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
    message = refusal({"ORDERLY_KAFKA_SECURITY_PROTOCOL": "ssl", "ORDERLY_KAFKA_SSL_CAFILE": str(tmp_path / "ca.pem")})
    assert message.startswith(f"ORDERLY_KAFKA_SSL_CAFILE={str(tmp_path / 'ca.pem')!r}: no CA certificate could be "
                              "read from it, it takes PEM certificates (")


def test_a_client_key_of_another_certificate_is_refused(pki: Pki) -> None:
    message = refusal({"ORDERLY_KAFKA_SECURITY_PROTOCOL": "ssl", "ORDERLY_KAFKA_SSL_CERTFILE": str(pki.cert("client")),
                       "ORDERLY_KAFKA_SSL_KEYFILE": str(pki.key("broker"))})
    assert "the client certificate and its private key do not load (" in message
    assert "KEY_VALUES_MISMATCH" in message


def test_every_refusal_is_reported_at_once(pki: Pki) -> None:
    message = refusal({**SASL_SSL, "ORDERLY_KAFKA_SSL_CAFILE": str(pki.key("broker"))})  # a key, not a certificate
    lines = message.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("ORDERLY_KAFKA_SECURITY_PROTOCOL=sasl_ssl authenticates with SASL, but")
    assert lines[1].startswith("ORDERLY_KAFKA_SSL_CAFILE=")
