"""Kafka security for the tests: a CA and certificates made with the openssl CLI, and a broker of
the project's jars with a SASL_SSL listener (SCRAM-SHA-512 and PLAIN) and a mutual-TLS listener.

The broker is app/stack/kafka.py's KafkaBroker with other listeners (``_properties``) and a SCRAM
user written into the metadata when the storage is formatted (``_format_args``). The controller
and the inter-broker listener stay PLAINTEXT on loopback.
"""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from app.stack.kafka import KafkaBroker
from app.stack.process import spare_port

SCRAM_USER, SCRAM_PASSWORD = "orderly-scram", "scram-Pa55-word"
PLAIN_USER, PLAIN_PASSWORD = "orderly-plain", "plain-Pa55-word"


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{result.stderr}")


@dataclass(frozen=True)
class Pki:
    """A CA and what it signed, as PEM files in ``folder``."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    def cert(self, name: str) -> Path:
        return self.folder / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.folder / f"{name}.key"

    def bundle(self, name: str) -> Path:
        """Key and certificate in one file (a PEM keystore)."""
        return self.folder / f"{name}-keystore.pem"


def make_ca(folder: Path, name: str = "orderly test CA") -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)
    return Pki(folder)


def issue(pki: Pki, name: str, san: str = "IP:127.0.0.1", usage: str = "serverAuth,clientAuth") -> Pki:
    """A certificate ``name`` signed by the CA (``name``.pem, unencrypted PKCS#8 ``name``.key, and both
    in ``name``-keystore.pem)."""
    folder = pki.folder
    (folder / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n"
                                        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={name}", cwd=folder)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=folder)
    pki.bundle(name).write_text(pki.key(name).read_text() + pki.cert(name).read_text())
    return pki


def ca_names(context: ssl.SSLContext) -> list[str]:
    """The common names of the CA certificates ``context`` trusts."""
    subjects = [cast("tuple[tuple[tuple[str, str], ...], ...]", ca["subject"]) for ca in context.get_ca_certs()]
    return [value for subject in subjects for rdn in subject for key, value in rdn if key == "commonName"]


class SecuredBroker(KafkaBroker):
    """A broker whose client listeners are SASL_SSL (``port``: SCRAM-SHA-512 and PLAIN) and SSL
    with required client certificates (``mtls_port``), its certificate for 127.0.0.1 from ``pki``."""

    def __init__(self, data_dir: Path, pki: Pki) -> None:
        super().__init__(data_dir)
        self.pki = pki
        self.internal_port = spare_port()
        self.mtls_port = spare_port()

    @property
    def mtls_bootstrap(self) -> str:
        return f"127.0.0.1:{self.mtls_port}"

    def _properties(self) -> str:
        ours = {
            "listeners": f"SASL_SSL://127.0.0.1:{self.port},MTLS://127.0.0.1:{self.mtls_port},"
                         f"INTERNAL://127.0.0.1:{self.internal_port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{self.port},MTLS://127.0.0.1:{self.mtls_port},"
                                    f"INTERNAL://127.0.0.1:{self.internal_port}",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,MTLS:SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.sasl_ssl.plain.sasl.jaas.config":
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'user_{PLAIN_USER}="{PLAIN_PASSWORD}";',
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.pki.bundle("broker")),
            "listener.name.mtls.ssl.client.auth": "required",
            "listener.name.mtls.ssl.truststore.type": "PEM",
            "listener.name.mtls.ssl.truststore.location": str(self.pki.ca),
        }
        lines = [line for line in super()._properties().splitlines()
                 if line and line.split("=", 1)[0] not in ours]
        return "\n".join([*lines, *(f"{key}={value}" for key, value in ours.items()), ""])

    def _format_args(self) -> list[str]:
        return [*super()._format_args(), "--add-scram", f"SCRAM-SHA-512=[name={SCRAM_USER},password={SCRAM_PASSWORD}]"]
