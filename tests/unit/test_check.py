"""Settings checked first (issue #48 item 2, DESIGN.md §6): every misconfiguration through the real
start-up of `orderly <command>` (app.cli.main), answered in one line on stderr naming the variable,
the fix and its row of docs/configuration.md, exit 2; each command requires only what it uses;
secrets from ``<NAME>_FILE``; `orderly check`'s lines (the settings part: reaching is
tests/integration/test_check_cli.py's)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app import check, cli
from app.address_kinds import Dsn, File, HostPorts, Port, Url
from app.setting_kinds import REQUIRED, Kind, Setting
from app.setting_uses import PROCESSES, USES
from app.settings import TABLE, Settings, SettingsError

DOWN = "127.0.0.1:1"  # nothing listens: a connection is refused at once
# A production environment every process starts with (up to connecting)
BASE = {"ORDERLY_KAFKA": DOWN, "ORDERLY_POSTGRES_DSN": f"postgresql://orderly:pw-never-shown@{DOWN}/orderly",
        "ORDERLY_API_TOKEN": "api-token-never-shown", "ORDERLY_ADMIN_TOKEN": "admin-token-never-shown",
        "ORDERLY_SECRET_PG": "s", "ORDERLY_SECRET_CARD": "whsec_Y2FyZC1zZWNyZXQta2V5", "ORDERLY_SECRET_PAYMOS": "s",
        "ORDERLY_SECRET_STRIPE": "whsec_s", "ORDERLY_SECRET_ADYEN": "00AA"}
PG_ONLY = {"ORDERLY_POSTGRES_DSN": BASE["ORDERLY_POSTGRES_DSN"]}
TAKES_KAFKA = "it takes host:port, comma-separated (e.g. `kafka-1:9092,kafka-2:9092`, no scheme)"
PG_DOWN = ("ORDERLY_POSTGRES_DSN: PostgreSQL did not answer: [Errno 111] Connect call failed ('127.0.0.1', 1); is it "
           "running, and does ORDERLY_POSTGRES_DSN name it? (docs/configuration.md#orderly_postgres_dsn)")
MISSING = Path("/nonexistent/orderly-secret")

# (command line, environment, the one line on stderr); every exit is 2
CASES: list[tuple[list[str], dict[str, str], str]] = [
    (["ingest"], {**BASE, "ORDERLY_KAFKA": "localhost:abc"},
     "orderly: configuration error: ORDERLY_KAFKA='localhost:abc': the port of 'localhost:abc' is not a number; "
     f"{TAKES_KAFKA} (docs/configuration.md#orderly_kafka)"),
    (["worker"], {**BASE, "ORDERLY_KAFKA": "http://127.0.0.1:1"},
     "orderly: configuration error: ORDERLY_KAFKA='http://127.0.0.1:1': 'http://127.0.0.1:1' is a URL: give "
     f"host:port without a scheme; {TAKES_KAFKA} (docs/configuration.md#orderly_kafka)"),
    (["projector"], {**BASE, "ORDERLY_KAFKA": "kafka-1:9092,kafka-2:99999"},
     "orderly: configuration error: ORDERLY_KAFKA='kafka-1:9092,kafka-2:99999': the port of 'kafka-2:99999' is 99999, "
     f"outside 1-65535; {TAKES_KAFKA} (docs/configuration.md#orderly_kafka)"),
    (["export", "--topic", "state", "--to", "x.parquet"], {**BASE, "ORDERLY_KAFKA": ":9092"},
     f"orderly: configuration error: ORDERLY_KAFKA=':9092': ':9092' is not host:port; {TAKES_KAFKA} "
     "(docs/configuration.md#orderly_kafka)"),
    (["migrate"], {**BASE, "ORDERLY_POSTGRES_DSN": "mysql://orderly:pw-never-shown@db/orderly"},
     "orderly: configuration error: ORDERLY_POSTGRES_DSN (value withheld): the scheme is mysql://, not postgresql://; "
     "it takes a `postgresql://user:password@host:5432/database` DSN (docs/configuration.md#orderly_postgres_dsn)"),
    (["parked"], {"ORDERLY_POSTGRES_DSN": "postgresql://orderly:pw-never-shown@db:0/orderly"},
     "orderly: configuration error: ORDERLY_POSTGRES_DSN (value withheld): its port is 0; it takes a "
     "`postgresql://user:password@host:5432/database` DSN (docs/configuration.md#orderly_postgres_dsn)"),
    (["ingest"], {**BASE, "ORDERLY_INGEST_PORT": "99999"},
     "orderly: configuration error: ORDERLY_INGEST_PORT='99999': outside 0-65535; it takes a port 0-65535 "
     "(docs/configuration.md#orderly_ingest_port)"),
    (["admin"], {**BASE, "ORDERLY_ADMIN_PORT": "http"},
     "orderly: configuration error: ORDERLY_ADMIN_PORT='http': not an integer; it takes a port 0-65535 "
     "(docs/configuration.md#orderly_admin_port)"),
    (["effects"], {**BASE, "ORDERLY_EFFECTS_URL": "ftp://merchant.example/effects"},
     "orderly: configuration error: ORDERLY_EFFECTS_URL='ftp://merchant.example/effects': the scheme is ftp://, not "
     "http:// or https://; it takes an http:// or https:// URL, or unset (docs/configuration.md#orderly_effects_url)"),
    (["fetcher"], {**BASE, "ORDERLY_CARD_API_URL": "card-api:8080"},
     "orderly: configuration error: ORDERLY_CARD_API_URL='card-api:8080': the scheme is card-api://, not http:// or "
     "https://; it takes an http:// or https:// URL, or unset (docs/configuration.md#orderly_card_api_url)"),
    (["projector"], {**BASE, "ORDERLY_PARKED_ALERT_AFTER_S": "0"},
     "orderly: configuration error: ORDERLY_PARKED_ALERT_AFTER_S='0': not a finite number above 0; it takes a finite "
     "number > 0 (docs/configuration.md#orderly_parked_alert_after_s)"),
    (["worker"], {**BASE, "ORDERLY_WORKER_STALL_S": "1m"},
     "orderly: configuration error: ORDERLY_WORKER_STALL_S='1m': not a number; it takes a finite number > 0 "
     "(docs/configuration.md#orderly_worker_stall_s)"),
    (["worker"], {**BASE, "ORDERLY_KAFKA_SECURITY_PROTOCOL": "ssl", "ORDERLY_KAFKA_SSL_CAFILE": "/nowhere/ca.pem"},
     "orderly: configuration error: ORDERLY_KAFKA_SSL_CAFILE='/nowhere/ca.pem': no such file; it takes a readable "
     "PEM file's path, or unset (docs/configuration.md#orderly_kafka_ssl_cafile)"),
    (["ingest"], {**BASE, "ORDERLY_SECRET_PAYMOS": ""},
     "orderly: configuration error: ORDERLY_SECRET_PAYMOS is not set or is empty: paymos signing secret(s); it takes "
     "secrets separated by commas, none empty (docs/configuration.md#orderly_secret_paymos)"),
    (["ingest"], {**BASE, "ORDERLY_GATEWAYS": "pg,paypal"},
     "orderly: configuration error: ORDERLY_GATEWAYS='pg,paypal': unknown gateway 'paypal'; it takes gateways "
     "separated by commas, each once, of pg, card, paymos, stripe, adyen (docs/configuration.md#orderly_gateways)"),
    (["ingest"], {**BASE, "ORDERLY_API_TOKEN_FILE": "/run/secrets/api-token"},
     "orderly: configuration error: ORDERLY_API_TOKEN and ORDERLY_API_TOKEN_FILE are both set: keep one "
     "(docs/configuration.md#orderly_api_token)"),
    (["admin"], {**BASE, "ORDERLY_ADMIN_TOKEN": "", "ORDERLY_ADMIN_TOKEN_FILE": str(MISSING)},
     f"orderly: configuration error: ORDERLY_ADMIN_TOKEN_FILE='{MISSING}': no such file or directory; it takes the "
     "path of a readable file holding ORDERLY_ADMIN_TOKEN (docs/configuration.md#orderly_admin_token)"),
    (["ingest"], {**BASE, "ORDERLY_KAFKA": "localhost:abc", "ORDERLY_APPEND_TIMEOUT_S": "-1"},
     "orderly: configuration error: ORDERLY_KAFKA='localhost:abc': the port of 'localhost:abc' is not a number; "
     f"{TAKES_KAFKA} (docs/configuration.md#orderly_kafka) (and 1 more: `orderly check ingest` lists them)"),
    (["effects"], {**BASE, "ORDERLY_EFFECTS_URL": "https://merchant.example/effects"},
     "orderly: configuration error: ORDERLY_EFFECTS_URL is set but ORDERLY_EFFECTS_SECRET is not: effects are only "
     "delivered signed; set ORDERLY_EFFECTS_SECRET=whsec_<base64 key> (the secret the merchant verifies with), or "
     "unset ORDERLY_EFFECTS_URL to record without delivering (docs/configuration.md#orderly_effects_url)"),
    (["admin"], {**BASE, "ORDERLY_ADMIN_TOKEN": ""},
     "orderly: configuration error: neither ORDERLY_ADMIN_OIDC_ISSUER nor ORDERLY_ADMIN_TOKEN is set: the admin API "
     "and console refuse to run when no one could sign in (docs/configuration.md#orderly_admin_oidc_issuer)"),
    (["worker"], {**BASE, "ORDERLY_REPLICATION_FACTOR": "3", "ORDERLY_MIN_INSYNC_REPLICAS": "3"},
     "orderly: configuration error: ORDERLY_MIN_INSYNC_REPLICAS: 3 of 3 replicas: losing any one broker would stop "
     "every write (503s); use at most 2 (docs/configuration.md#orderly_min_insync_replicas)"),
    (["ingest"], {**BASE, "ORDERLY_KAFKA_SASL_USERNAME": "u"},
     "orderly: configuration error: ORDERLY_KAFKA_SASL_USERNAME is set, but ORDERLY_KAFKA_SECURITY_PROTOCOL=plaintext "
     "does not authenticate with SASL (use sasl_ssl or sasl_plaintext, or unset them) "
     "(docs/configuration.md#orderly_kafka_sasl_username)"),
    # each command requires only what it uses: no secret, no token, no Kafka for `parked` — it gets as
    # far as PostgreSQL, which is down: one line too
    (["parked"], PG_ONLY, f"orderly parked: {PG_DOWN}"),
    (["inspect", "card", "pay_1"], PG_ONLY, f"orderly inspect: {PG_DOWN}"),
    (["quarantine", "redrive", "d-1"], {**PG_ONLY, "ORDERLY_KAFKA": DOWN}, f"orderly quarantine: {PG_DOWN}"),
    (["parked"], {}, "orderly: configuration error: ORDERLY_POSTGRES_DSN is not set or is empty: PostgreSQL DSN; it "
     "takes a `postgresql://user:password@host:5432/database` DSN (docs/configuration.md#orderly_postgres_dsn) (and no "
     "running `orderly dev` was found: {data}/stack.json is missing or unreadable)"),
]


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No ORDERLY_* variable of the test run's own; the data directory (a stack.json) empty."""
    for name in list(os.environ):
        if name.startswith("ORDERLY_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ORDERLY_DATA_DIR", str(tmp_path))
    return monkeypatch


@pytest.mark.parametrize(("argv", "env", "line"), CASES, ids=[f"{c[0][0]}-{i}" for i, c in enumerate(CASES)])
def test_each_misconfiguration_is_one_line_and_exit_2(environment: pytest.MonkeyPatch, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str], argv: list[str],
                                                      env: dict[str, str], line: str) -> None:
    for name, value in env.items():
        environment.setenv(name, value)
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [line.replace("{data}", str(tmp_path))], err
    assert "never-shown" not in out + err


def test_a_secret_from_its_file_loses_one_trailing_newline(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-a-file\n\n", encoding="utf-8")
    (tmp_path / "dsn").write_text("postgresql://o:p@db:5432/o\r\n", encoding="utf-8")
    env = {**BASE, "ORDERLY_API_TOKEN": "", "ORDERLY_API_TOKEN_FILE": str(tmp_path / "token"),
           "ORDERLY_POSTGRES_DSN": "", "ORDERLY_POSTGRES_DSN_FILE": str(tmp_path / "dsn")}
    settings = Settings.from_env(env)
    assert settings.api_token.reveal() == "from-a-file\n"  # one newline dropped, not every whitespace
    assert settings.postgres_dsn.reveal() == "postgresql://o:p@db:5432/o"
    assert "from-a-file" not in repr(settings) and "o:p@db" not in repr(settings)
    assert Settings.from_env({**env, **settings.to_env()}) == settings  # a child's environment wins over the file


def test_a_secret_file_larger_than_any_secret_is_refused_unread(tmp_path: Path) -> None:
    # a wrong path (a log, a dump, /dev/zero) is refused after 64 KiB, not read whole into memory
    (tmp_path / "big").write_text("x" * (1 << 20), encoding="utf-8")
    for path in (str(tmp_path / "big"), "/dev/zero"):
        with pytest.raises(SettingsError, match=f"ORDERLY_API_TOKEN_FILE='{path}': larger than 64 KiB"):
            Settings.from_env({**BASE, "ORDERLY_API_TOKEN": "", "ORDERLY_API_TOKEN_FILE": path})


def test_every_secret_row_takes_a_file_and_only_secrets_do(tmp_path: Path) -> None:
    (tmp_path / "kafka").write_text("db:9092\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="ORDERLY_KAFKA is not set"):
        Settings.from_env({**BASE, "ORDERLY_KAFKA": "", "ORDERLY_KAFKA_FILE": str(tmp_path / "kafka")})
    (tmp_path / "secret").write_text("whsec_ZmlsZWQtZWZmZWN0cy1zZWNyZXQ=\n", encoding="utf-8")
    settings = Settings.from_env({**BASE, "ORDERLY_EFFECTS_SECRET_FILE": str(tmp_path / "secret"),
                                  "ORDERLY_SECRET_PG_FILE": str(tmp_path / "secret"), "ORDERLY_SECRET_PG": ""})
    assert settings.effects_secret is not None
    assert settings.effects_secret.reveal() == settings.secrets["pg"].reveal()[0]
    assert settings.secrets["pg"].reveal() == ("whsec_ZmlsZWQtZWZmZWN0cy1zZWNyZXQ=",)


SAMPLES = {"ORDERLY_ADYEN_BASIC_AUTH": "adyen:pw", "ORDERLY_POSTGRES_DSN": "postgresql://o:pw@db:5432/o",
           "ORDERLY_EFFECTS_SECRET": "whsec_ZmlsZWQtZWZmZWN0cy1zZWNyZXQ="}


@pytest.mark.parametrize("row", [row for row in TABLE if row.is_secret], ids=lambda row: row.env)
def test_every_secret_may_come_from_a_file(row: Setting[Any], tmp_path: Path) -> None:
    sample = SAMPLES.get(row.env, row.dev or "a-secret-value")
    (tmp_path / "secret").write_text(sample + "\n", encoding="utf-8")
    from_file = row.read({f"{row.env}_FILE": str(tmp_path / "secret")})
    assert from_file == row.read({row.env: sample}) and repr(from_file) == "Secret('**********')"
    with pytest.raises(SettingsError, match=f"{row.env} and {row.env}_FILE are both set"):
        row.read({row.env: sample, f"{row.env}_FILE": str(tmp_path / "secret")})


@pytest.mark.parametrize("process", [*PROCESSES, "parked", "inspect", "gaps", "replay", "export"])
def test_each_process_requires_only_the_required_settings_it_uses(process: str) -> None:
    needed = {row.env for row in TABLE if row.field in USES[process] and row.default is REQUIRED and row.key is None}
    env = {name: value for name, value in BASE.items() if name in needed or (
        name.startswith("ORDERLY_SECRET_") and "secrets" in USES[process])}
    env |= {"ORDERLY_ADMIN_TOKEN": BASE["ORDERLY_ADMIN_TOKEN"]} if process == "admin" else {}
    settings = Settings.from_env(env, USES[process])
    assert bool(vars(settings)["secrets"]) is (process == "ingest")
    for name in needed:
        with pytest.raises(SettingsError, match=f"{name} is not set"):
            Settings.from_env({k: v for k, v in env.items() if k != name}, USES[process])


def test_parked_is_not_refused_for_what_it_does_not_use() -> None:
    settings = Settings.from_env(PG_ONLY, {"postgres_dsn", "namespace"})
    assert settings.namespace == "orderly"
    with pytest.raises(AttributeError):
        settings.api_token  # noqa: B018  (not read: a process that reads it is missing it from its table)


def test_check_prints_a_line_per_setting_and_never_a_secret(capsys: pytest.CaptureFixture[str]) -> None:
    code = check.run(["ingest"], {**BASE, "ORDERLY_KAFKA": "localhost:abc", "ORDERLY_POSTGRES_DSN": "mysql://u:pw@h/d"})
    out = capsys.readouterr().out.splitlines()
    assert code == 2
    assert out[0].startswith("fail ORDERLY_KAFKA='localhost:abc': the port of 'localhost:abc' is not a number")
    assert out[1].startswith("fail ORDERLY_POSTGRES_DSN (value withheld): the scheme is mysql://")
    assert "ok ORDERLY_API_TOKEN set (21 chars)" in out and "ok ORDERLY_SECRET_PG set (1 chars)" in out
    assert "ok ORDERLY_INGEST_PORT = 8080 (default)" in out and "ok ORDERLY_GATEWAYS = pg,card,paymos,stripe,adyen " \
                                                                "(default)" in out
    assert "ok ORDERLY_ADMIN_TOKEN set (23 chars)" in out  # not the ingest's, but set: read, so checked
    assert not any("ADMIN_OIDC" in line for line in out)  # neither the ingest's nor set
    assert out[-1] == "36 ok, 2 failed (nothing reached: settings first)" and "never-shown" not in "\n".join(out)


def test_check_names_a_combination_it_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    code = check.run(["effects"], {**BASE, "ORDERLY_EFFECTS_URL": "http://merchant.example/effects",
                                   "ORDERLY_EFFECTS_SECRET": "whsec_ZmlsZWQtZWZmZWN0cy1zZWNyZXQ="})
    out = capsys.readouterr().out.splitlines()
    assert code == 2 and out[-2].startswith("fail ORDERLY_EFFECTS_URL is http:// to a host that is not a loopback")


def test_check_never_prints_a_url_s_password(capsys: pytest.CaptureFixture[str]) -> None:
    # a merchant behind basic auth is given as https://user:password@host/…: the ok line and the
    # unreached line show the URL without its password
    url = "https://orderly:url-pw-never-shown@127.0.0.1:1/effects"
    code = check.run(["effects"], {**BASE, "ORDERLY_KAFKA": "127.0.0.1:1", "ORDERLY_EFFECTS_URL": url,
                                   "ORDERLY_EFFECTS_SECRET": "whsec_ZmlsZWQtZWZmZWN0cy1zZWNyZXQ="})
    out = capsys.readouterr().out
    assert code == 2 and "never-shown" not in out
    assert "ok ORDERLY_EFFECTS_URL = https://orderly:***@127.0.0.1:1/effects" in out.splitlines()
    assert "fail ORDERLY_EFFECTS_URL: https://orderly:***@127.0.0.1:1/effects was not reached" in out


def test_check_refuses_an_unknown_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert check.run(["ingset"], BASE) == 2
    assert capsys.readouterr().err.startswith("orderly check: no process or command ingset; one of ingest, worker")


PORT = st.integers(min_value=1, max_value=65535)
HOST = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z0-9]{1,10}){0,3}", fullmatch=True)


@given(st.lists(st.tuples(HOST, PORT), min_size=1, max_size=4))
def test_any_host_port_list_is_taken_as_written(pairs: list[tuple[str, int]]) -> None:
    text = ",".join(f"{host}:{port}" for host, port in pairs)
    assert HostPorts().parse(text) == text


@given(HOST, st.one_of(st.integers(min_value=65536), st.integers(max_value=0)), st.sampled_from(["", "http://"]))
def test_a_port_out_of_range_or_a_scheme_is_refused(host: str, port: int, scheme: str) -> None:
    with pytest.raises(ValueError, match=r"outside 1-65535|is a URL|not a number"):
        HostPorts().parse(f"{scheme}{host}:{port}")


@pytest.mark.parametrize(("kind", "text", "refusal"), [
    (Url(), "https://merchant.example/effects", None),
    (Url(), "http://[::1]:8080/x", None),
    (Url(), "http://merchant.example:99999/x", "its port is not a number 1-65535"),
    (Url(), "http:///effects", "it names no host"),
    (Url(), "merchant.example/effects", "the scheme is missing, not http:// or https://"),
    (Dsn(), "postgres://orderly@db/orderly", None),
    (Dsn(), "postgresql:///orderly?host=/run/postgresql", None),
    (Dsn(), "postgresql://orderly@db:65536/orderly", "its port is not a number 1-65535"),
    (Dsn(), "db:5432/orderly", "the scheme is missing, not postgresql://"),
    (Port(), "0", "outside 1-65535"),
    (Port(minimum=0), "65535", None),
    (HostPorts(), "my_kafka:9092,[::1]:9093", None),
    (HostPorts(), "kafka-1:9092,", "'' is not host:port"),
    (File(), "/nonexistent/ca.pem", "no such file"),
])
def test_each_place_kind(kind: Kind[Any], text: str, refusal: str | None) -> None:
    if refusal is None:
        assert kind.parse(text) is not None
    else:
        with pytest.raises(ValueError, match=re.escape(refusal)):
            kind.parse(text)
