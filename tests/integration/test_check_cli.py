"""The real `orderly` console script as a subprocess (issue #48 item 2): a refused setting and an
unreachable Kafka or PostgreSQL end in exactly one line on stderr and exit 2; `orderly check` against
a real Kafka and PostgreSQL (the session's fixtures) passes, and fails with one URL that answers
nothing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {"ORDERLY_API_TOKEN": "api-token-never-shown", "ORDERLY_ADMIN_TOKEN": "admin-token-never-shown",
           "ORDERLY_SECRET_PG": "s", "ORDERLY_SECRET_CARD": "whsec_Y2FyZC1zZWNyZXQta2V5", "ORDERLY_SECRET_PAYMOS": "s",
           "ORDERLY_SECRET_STRIPE": "whsec_s", "ORDERLY_SECRET_ADYEN": "00AA"}


def closed_port() -> int:
    """A port nothing listens on (taken, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def orderly(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m app.cli ARGS` with only ``env``'s settings (none of the test run's own)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORDERLY_")}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False, env={**base, "ORDERLY_DATA_DIR": str(tmp_path), **env})


@pytest.mark.parametrize(("args", "env", "starts"), [
    (["worker"], {"ORDERLY_KAFKA": "localhost:abc", "ORDERLY_POSTGRES_DSN": "postgresql://o@127.0.0.1:1/o"},
     "orderly: configuration error: ORDERLY_KAFKA='localhost:abc': the port of 'localhost:abc' is not a number"),
    (["projector"], {"ORDERLY_KAFKA": "http://127.0.0.1:1", "ORDERLY_POSTGRES_DSN": "postgresql://o@127.0.0.1:1/o"},
     "orderly: configuration error: ORDERLY_KAFKA='http://127.0.0.1:1': 'http://127.0.0.1:1' is a URL"),
    (["migrate"], {"ORDERLY_KAFKA": "127.0.0.1:1", "ORDERLY_POSTGRES_DSN": "mysql://o:pw-never-shown@db/o"},
     "orderly: configuration error: ORDERLY_POSTGRES_DSN (value withheld): the scheme is mysql://, not postgresql://"),
    (["ingest"], {"ORDERLY_KAFKA": "127.0.0.1:1", "ORDERLY_POSTGRES_DSN": "postgresql://o@127.0.0.1:1/o",
                  "ORDERLY_INGEST_PORT": "99999", **SECRETS},
     "orderly: configuration error: ORDERLY_INGEST_PORT='99999': outside 0-65535; it takes a port 0-65535"),
    (["migrate"], {"ORDERLY_KAFKA": "127.0.0.1:{closed}", "ORDERLY_POSTGRES_DSN": "postgresql://o@127.0.0.1:1/o"},
     "orderly migrate: ORDERLY_KAFKA: Kafka did not answer: KafkaConnectionError: Unable to bootstrap from"),
    (["parked"], {"ORDERLY_POSTGRES_DSN": "postgresql://o:pw-never-shown@127.0.0.1:{closed}/o"},
     "orderly parked: ORDERLY_POSTGRES_DSN: PostgreSQL did not answer: [Errno 111] Connect call failed"),
    (["quarantine", "redrive", "d-1"], {"ORDERLY_KAFKA": "127.0.0.1:1",
                                        "ORDERLY_POSTGRES_DSN": "postgresql://o@127.0.0.1:{closed}/o"},
     "orderly quarantine: ORDERLY_POSTGRES_DSN: PostgreSQL did not answer"),
    (["admin"], {"ORDERLY_KAFKA": "127.0.0.1:1", "ORDERLY_POSTGRES_DSN": "postgresql://o@127.0.0.1:{closed}/o",
                 "ORDERLY_ADMIN_TOKEN": "admin-token-never-shown"},
     "orderly admin: ORDERLY_POSTGRES_DSN: PostgreSQL did not answer"),
], ids=["kafka-port", "kafka-url", "mysql-dsn", "port-99999", "migrate-kafka-down", "parked-pg-down",
        "redrive-pg-down", "admin-pg-down"])
def test_one_line_and_exit_2(tmp_path: Path, args: list[str], env: dict[str, str], starts: str) -> None:
    closed = str(closed_port())
    done = orderly(tmp_path, *args, **{k: v.replace("{closed}", closed) for k, v in env.items()})
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(starts), done.stderr
    assert "docs/configuration.md#orderly_" in done.stderr and "never-shown" not in done.stderr + done.stdout


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_check_against_a_running_kafka_and_postgres(kafka: KafkaBroker, postgres: PostgresServer, http_url: str,
                                                    tmp_path: Path) -> None:
    env = {"ORDERLY_KAFKA": kafka.bootstrap, "ORDERLY_POSTGRES_DSN": postgres.dsn, **SECRETS,
           "ORDERLY_CARD_API_URL": f"{http_url}/card"}
    done = orderly(tmp_path, "check", **env)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ok ORDERLY_KAFKA = {kafka.bootstrap}" in lines and "ok ORDERLY_KAFKA reached (1 broker)" in lines
    assert any(line.startswith("ok ORDERLY_POSTGRES_DSN reached (PostgreSQL ") for line in lines)
    assert "ok ORDERLY_CARD_API_URL reached (HTTP 404)" in lines and "ok ORDERLY_API_TOKEN set (21 chars)" in lines
    assert not [line for line in lines[:-1] if not line.startswith("ok ")] and lines[-1].endswith(" ok, 0 failed")
    assert "never-shown" not in done.stdout and done.stderr == ""

    effects_url = f"http://127.0.0.1:{closed_port()}/effects"
    wrong = orderly(tmp_path, "check", "effects", **env, ORDERLY_EFFECTS_URL=effects_url,
                    ORDERLY_EFFECTS_SECRET="whsec_ZmlsZWQtZWZmZWN0cy1zZWNyZXQ=")
    failed = [line for line in wrong.stdout.splitlines() if line.startswith("fail ")]
    assert wrong.returncode == 2, wrong.stdout
    assert len(failed) == 1 and failed[0].startswith(f"fail ORDERLY_EFFECTS_URL: {effects_url} was not reached "
                                                     "(deadline 5 s): Cannot connect to host 127.0.0.1:")
    assert failed[0].endswith("(docs/configuration.md#orderly_effects_url)") and wrong.stderr == ""
    assert "ok ORDERLY_KAFKA reached (1 broker)" in wrong.stdout  # the rest still checked

    issuer = orderly(tmp_path, "check", "admin", **env, ORDERLY_ADMIN_OIDC_ISSUER=http_url,
                     ORDERLY_ADMIN_OIDC_CLIENT_ID="orderly-admin", ORDERLY_ADMIN_ROLE_MAP="oncall=operator",
                     ORDERLY_ADMIN_OIDC_REDIRECT_URL="https://admin.example/auth/callback")
    assert issuer.returncode == 2, issuer.stdout
    assert [line for line in issuer.stdout.splitlines() if line.startswith("fail ")] == [
        f"fail ORDERLY_ADMIN_OIDC_ISSUER: {http_url}/.well-known/openid-configuration answered HTTP 404, not the "
        "issuer's discovery document; is ORDERLY_ADMIN_OIDC_ISSUER the issuer's URL? "
        "(docs/configuration.md#orderly_admin_oidc_issuer)"]
