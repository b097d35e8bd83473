"""Orderly against a Kafka that needs TLS and SASL, as every managed Kafka does: a broker of the
project's jars with a SASL_SSL listener (SCRAM-SHA-512 and PLAIN) and a mutual-TLS listener, its
certificate for 127.0.0.1 signed by a CA the test makes itself (tests/kafka_security.py).

The SCRAM user has no PLAIN password and the PLAIN user no SCRAM credentials, so a process that
gets through as one of them used that mechanism."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.bootstrap import prepare
from app.kafka_client import KafkaRefusedError, security_errors
from app.settings import Secret, Settings
from app.stack.postgres import PostgresServer
from tests.kafka_security import PLAIN_PASSWORD, PLAIN_USER, SCRAM_PASSWORD, SCRAM_USER, SecuredBroker, issue, make_ca
from tests.pipeline import running_pipeline
from tests.support import make_settings, serve_ingest
from topics.catalog import catalog


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    pki = issue(issue(make_ca(tmp_path_factory.mktemp("pki")), "broker"), "client")
    secured = SecuredBroker(tmp_path_factory.mktemp("secured-kafka"), pki)
    secured.start()
    yield secured
    secured.stop()


def sasl(broker: SecuredBroker, postgres: PostgresServer, mechanism: str, user: str, password: str,
         **overrides: object) -> Settings:
    secured: dict[str, object] = {
        "kafka_security_protocol": "sasl_ssl", "kafka_sasl_mechanism": mechanism, "kafka_sasl_username": user,
        "kafka_sasl_password": Secret(password), "kafka_ssl_cafile": str(broker.pki.ca)}
    settings = make_settings(broker.bootstrap, postgres.dsn, f"sec{uuid.uuid4().hex[:8]}",
                             **{**secured, **overrides})
    assert security_errors(settings) == []
    return settings


def sasl_env(mechanism: str, user: str, password: str) -> dict[str, str]:
    return {"ORDERLY_KAFKA_SASL_MECHANISM": mechanism, "ORDERLY_KAFKA_SASL_USERNAME": user,
            "ORDERLY_KAFKA_SASL_PASSWORD": password}


def test_the_pipeline_runs_over_sasl_ssl_with_scram_sha_512_and_with_plain(
        broker: SecuredBroker, postgres: PostgresServer, tmp_path: Path) -> None:
    scram = sasl(broker, postgres, "scram-sha-512", SCRAM_USER, SCRAM_PASSWORD)
    # prepare() (topics, migrations) runs over SCRAM in running_pipeline; so do the worker (Faust),
    # projector, effects and fetcher processes, the ingest and the admin served in threads
    with running_pipeline(scram, tmp_path) as run:
        created = {t.name for t in catalog(scram.namespace, scram.partitions, scram.replication_factor)}
        assert created <= set(asyncio.run(_topics(scram)))
        # a correlation and a signed pg webhook answered 200 by the ingest, decided by the worker,
        # its read-model row written by the projector
        asyncio.run(run.canary("dep_scram_1", timeout=60))
        # the worker and the projector again, now as the PLAIN user, with an ingest that is too
        plain_env = sasl_env("plain", PLAIN_USER, PLAIN_PASSWORD)
        for name in ("worker", "projector"):
            run.pipeline.terminate(name)
            run.pipeline.start(name, **plain_env)
        plain = run.settings.with_overrides(kafka_sasl_mechanism="plain", kafka_sasl_username=PLAIN_USER,
                                            kafka_sasl_password=Secret(PLAIN_PASSWORD))
        with serve_ingest(plain) as ingest:
            asyncio.run(dataclasses.replace(run, settings=plain, ingest=ingest).canary("dep_plain_1", timeout=60))


async def _topics(settings: Settings) -> list[str]:
    from aiokafka.admin import AIOKafkaAdminClient

    from app.kafka_client import client_options

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, **client_options(settings))
    await admin.start()
    try:
        return list(await admin.list_topics())
    finally:
        await admin.close()


def test_a_wrong_password_stops_the_worker_at_start_with_the_reason(
        broker: SecuredBroker, postgres: PostgresServer, tmp_path: Path) -> None:
    wrong = sasl(broker, postgres, "scram-sha-512", SCRAM_USER, "not-the-Pa55-word", data_dir=tmp_path)
    result = subprocess.run([sys.executable, "-m", "app.cli", "worker"], env={**os.environ, **wrong.to_env()},
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert (f"orderly: configuration error: Kafka at {broker.bootstrap} refused the SASL authentication of user "
            f"'{SCRAM_USER}' with SCRAM-SHA-512: [Error 58] SaslAuthenticationFailed: Authentication failed during "
            "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512; check "
            "ORDERLY_KAFKA_SASL_USERNAME, ORDERLY_KAFKA_SASL_PASSWORD and ORDERLY_KAFKA_SASL_MECHANISM") \
        in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "not-the-Pa55-word" not in result.stderr + result.stdout


def test_a_mechanism_the_user_has_no_credentials_for_is_refused(
        broker: SecuredBroker, postgres: PostgresServer) -> None:
    with pytest.raises(KafkaRefusedError, match=f"refused the SASL authentication of user '{PLAIN_USER}' with "
                                                "SCRAM-SHA-512: .*SaslAuthenticationFailed"):
        asyncio.run(prepare(sasl(broker, postgres, "scram-sha-512", PLAIN_USER, PLAIN_PASSWORD)))


def test_without_the_ca_the_tls_handshake_is_refused(broker: SecuredBroker, postgres: PostgresServer,
                                                     tmp_path: Path) -> None:
    system_cas = sasl(broker, postgres, "scram-sha-512", SCRAM_USER, SCRAM_PASSWORD, kafka_ssl_cafile=None)
    other = make_ca(tmp_path / "other", name="another CA")
    another_ca = sasl(broker, postgres, "scram-sha-512", SCRAM_USER, SCRAM_PASSWORD, kafka_ssl_cafile=str(other.ca))
    for settings in (system_cas, another_ca):
        with pytest.raises(KafkaRefusedError, match=f"the TLS handshake with Kafka at {broker.bootstrap} failed: "
                                                    r"\[SSL: CERTIFICATE_VERIFY_FAILED\] certificate verify failed: "
                                                    "unable to get local issuer certificate"):
            asyncio.run(prepare(settings))


def test_the_broker_certificate_must_name_the_host_unless_the_check_is_off(
        broker: SecuredBroker, postgres: PostgresServer) -> None:
    by_name = f"localhost:{broker.port}"  # the certificate names 127.0.0.1 only
    checked = sasl(broker, postgres, "scram-sha-512", SCRAM_USER, SCRAM_PASSWORD).with_overrides(
        kafka_bootstrap=by_name)
    with pytest.raises(KafkaRefusedError, match="certificate verify failed: Hostname mismatch, certificate is not "
                                                "valid for 'localhost'"):
        asyncio.run(prepare(checked))
    unchecked = checked.with_overrides(kafka_ssl_check_hostname=False)
    created, _ = asyncio.run(prepare(unchecked))
    assert sorted(created) == sorted(t.name for t in catalog(unchecked.namespace, unchecked.partitions, 1))


def test_mutual_tls_needs_the_client_certificate(broker: SecuredBroker, postgres: PostgresServer) -> None:
    pki = broker.pki
    mtls = make_settings(broker.mtls_bootstrap, postgres.dsn, f"mtls{uuid.uuid4().hex[:8]}",
                         kafka_security_protocol="ssl", kafka_ssl_cafile=str(pki.ca),
                         kafka_ssl_certfile=str(pki.cert("client")), kafka_ssl_keyfile=str(pki.key("client")))
    assert security_errors(mtls) == []
    created, _ = asyncio.run(prepare(mtls))
    assert sorted(created) == sorted(t.name for t in catalog(mtls.namespace, mtls.partitions, 1))
    anonymous = mtls.with_overrides(namespace=f"mtls{uuid.uuid4().hex[:8]}", kafka_ssl_certfile=None,
                                    kafka_ssl_keyfile=None)
    with pytest.raises(KafkaRefusedError, match=f"the TLS handshake with Kafka at {broker.mtls_bootstrap} failed: "
                                                r"\[SSL: \w+_ALERT_\w+\] .*; the broker requires a client "
                                                "certificate"):
        asyncio.run(prepare(anonymous))


def test_a_client_speaking_another_protocol_than_the_listener_is_told_so(
        broker: SecuredBroker, postgres: PostgresServer) -> None:
    """The commonest slip with a managed Kafka: the protocol forgotten (plaintext, or TLS without
    SASL, against a SASL_SSL listener). The broker hangs up without an answer; the start says so."""
    plain = make_settings(broker.bootstrap, postgres.dsn, f"sec{uuid.uuid4().hex[:8]}")
    tls_only = sasl(broker, postgres, "scram-sha-512", SCRAM_USER, SCRAM_PASSWORD, kafka_security_protocol="ssl",
                    kafka_sasl_mechanism=None, kafka_sasl_username=None, kafka_sasl_password=None)
    for settings, protocol in ((plain, "plaintext"), (tls_only, "ssl")):
        with pytest.raises(KafkaRefusedError, match=f"Kafka at {broker.bootstrap} accepts connections but closed "
                                                    "this client's without an answer: its listener speaks another "
                                                    f"protocol than ORDERLY_KAFKA_SECURITY_PROTOCOL={protocol}"):
            asyncio.run(prepare(settings))
