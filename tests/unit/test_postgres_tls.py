"""PostgreSQL TLS through ORDERLY_POSTGRES_DSN: asyncpg (0.32) reads sslmode, sslrootcert, sslcert,
sslkey, sslpassword, sslcrl and ssl_min/max_protocol_version from the DSN's query, so a DSN is all
an operator sets (docs/production.md, Kafka and PostgreSQL security). Held here through asyncpg's own parser,
which every connect and pool of Orderly goes through."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import quote

import pytest
from asyncpg import connect_utils

from tests.kafka_security import Pki, ca_names, issue, make_ca


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return issue(issue(make_ca(tmp_path_factory.mktemp("pki")), "db"), "client")


def parsed_ssl(dsn: str) -> tuple[Any, Any]:
    """The SSL context and mode asyncpg makes of ``dsn``."""
    parse: Any = connect_utils.__dict__["_parse_connect_dsn_and_args"]  # private, absent from the stubs
    _addrs, params = parse(
        dsn=dsn, host=None, port=None, user=None, password=None, passfile=None, database=None, ssl=None,
        service=None, servicefile=None, direct_tls=None, server_settings=None, target_session_attrs=None,
        krbsrvname=None, gsslib=None)
    return params.ssl, params.sslmode


def test_verify_full_checks_the_chain_against_the_root_cert_and_the_host_name(pki: Pki) -> None:
    context, mode = parsed_ssl(f"postgresql://orderly@db.example:5432/orderly?sslmode=verify-full"
                               f"&sslrootcert={quote(str(pki.ca))}")
    assert mode == connect_utils.SSLMode.verify_full
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert ca_names(context) == ["orderly test CA"]
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_verify_ca_checks_the_chain_only(pki: Pki) -> None:
    context, mode = parsed_ssl(f"postgresql://orderly@10.0.0.5/orderly?sslmode=verify-ca&sslrootcert={pki.ca}")
    assert mode == connect_utils.SSLMode.verify_ca
    assert context.verify_mode == ssl.CERT_REQUIRED and not context.check_hostname


def test_a_client_certificate_and_the_minimum_tls_version_come_from_the_dsn(pki: Pki) -> None:
    context, _ = parsed_ssl(f"postgresql://orderly@db.example/orderly?sslmode=verify-full&sslrootcert={pki.ca}"
                            f"&sslcert={pki.cert('client')}&sslkey={pki.key('client')}"
                            "&ssl_min_protocol_version=TLSv1.3")
    assert context.minimum_version == ssl.TLSVersion.TLSv1_3


def test_a_missing_root_certificate_is_refused_before_connecting(tmp_path: Any) -> None:
    with pytest.raises(FileNotFoundError):
        parsed_ssl(f"postgresql://orderly@db.example/orderly?sslmode=verify-full&sslrootcert={tmp_path}/none.pem")


def test_without_sslmode_asyncpg_prefers_tls_but_verifies_nothing() -> None:
    """What docs/production.md warns about: the default 'prefer' encrypts when the server offers TLS, with
    no check of who the server is."""
    context, mode = parsed_ssl("postgresql://orderly@db.example/orderly")
    assert mode == connect_utils.SSLMode.prefer
    assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname
