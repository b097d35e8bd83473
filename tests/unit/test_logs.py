"""app/logs.py: JSON and text lines with their context fields, secrets kept out, sampling under a flood."""

from __future__ import annotations

import io
import logging
import logging.config
from collections.abc import Iterator
from datetime import datetime

import orjson
import pytest
from mode.utils import logging as mode_logging

from app import logs
from app.settings import DEV_DEFAULTS, TABLE, Secret, Settings
from tests.support import make_settings


@pytest.fixture(autouse=True)
def fresh_root() -> Iterator[None]:
    """Each test configures the root logger its own way; pytest's and the others' are put back after."""
    root = logging.getLogger()
    handlers, level, secrets = root.handlers[:], root.level, logs._secrets[:]
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logs._secrets[:] = secrets


def capture(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(logs.ContextFilter())
    logger = logging.getLogger("orderly.test-logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_line_carries_time_level_logger_message_and_the_context() -> None:
    logger, stream = capture(logs.JsonFormatter())
    with logs.bound(gateway="card", delivery_id="d-1"):
        logger.warning("401 %s: %s", "card", "no webhook-signature v1 matches", extra={"resource_id": "pay_1"})
    logger.info("outside")

    first, second = lines(stream)
    assert set(first) == {"timestamp", "level", "logger", "message", "gateway", "delivery_id", "resource_id"}
    assert (first["level"], first["logger"], first["message"]) == (
        "WARNING", "orderly.test-logs", "401 card: no webhook-signature v1 matches")
    assert (first["gateway"], first["delivery_id"], first["resource_id"]) == ("card", "d-1", "pay_1")
    assert datetime.fromisoformat(str(first["timestamp"])).utcoffset() is not None  # an aware UTC time
    assert set(second) == {"timestamp", "level", "logger", "message"}  # the context ended with the block


def test_an_exception_is_one_json_line_with_its_traceback() -> None:
    logger, stream = capture(logs.JsonFormatter())
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    [line] = lines(stream)
    assert line["message"] == "failed" and "ValueError: boom" in str(line["exc_info"])


def test_no_secret_reaches_a_line_in_either_format() -> None:
    settings = make_settings("127.0.0.1:1", "postgresql://orderly:pg-password-1@127.0.0.1:5/x", "ns",
                             effects_secret=Secret("whsec_ZWZmZWN0cy1zZWNyZXQtZm9yLXRlc3Rz"),
                             admin_token=Secret("admin-token-1"))
    secrets = [s for s in logs.secrets_of(settings) if s]
    # every row marked secret is covered, and the DSN's password on its own
    assert {"pg-test-secret", "paymos-test-secret", "test-token", "admin-token-1", "pg-password-1",
            "whsec_ZWZmZWN0cy1zZWNyZXQtZm9yLXRlc3Rz", settings.postgres_dsn.reveal()} <= set(secrets)
    for row in TABLE:
        if row.is_secret:
            value = row.value(settings)
            value = value.reveal() if isinstance(value, Secret) else value
            assert all(v is None or v in secrets for v in (value if isinstance(value, tuple) else (value,))), row.env
    logs.protect(logs.secrets_of(settings))
    for formatter in (logs.JsonFormatter(), logs.TextFormatter()):
        logger, stream = capture(formatter)
        logger.error("could not reach %s with %s", settings.postgres_dsn.reveal(), settings.api_token.reveal(),
                     extra={"authorization": "Bearer abc", "body": '{"email": "a@b.c"}', "payload": {"x": 1},
                            "reason": "bad pg-test-secret"})
        text = stream.getvalue()
        for value in (*secrets, "pg-password-1", "Bearer abc", "a@b.c"):
            assert value not in text, (type(formatter).__name__, value)
        assert logs.REDACTED in text


def test_the_json_format_redacts_fields_by_name() -> None:
    logger, stream = capture(logs.JsonFormatter())
    logger.info("x", extra={"api_key": "k", "webhook_signature": "v1,abc", "headers_cookie": "c", "gateway": "pg"})
    [line] = lines(stream)
    assert (line["api_key"], line["webhook_signature"], line["headers_cookie"], line["gateway"]) == (
        logs.REDACTED, logs.REDACTED, logs.REDACTED, "pg")


def test_text_lines_append_the_context() -> None:
    logger, stream = capture(logs.TextFormatter())
    with logs.bound(gateway="pg", resource_id=None):
        logger.info("hello", extra={"delivery_id": "d9"})
    assert stream.getvalue().rstrip().endswith("INFO orderly.test-logs: hello [gateway=pg delivery_id=d9]")


def test_fausts_own_set_up_with_our_config_writes_json(capsys: pytest.CaptureFixture[str]) -> None:
    """The worker hands logs.logging_config to Faust's worker, whose mode.utils.logging.setup_logging
    replaces the root's handlers with it: Faust's and mode's lines come out as JSON too."""
    mode_logging.setup_logging(loglevel="info", logging_config=logs.logging_config("json", logging.INFO))
    logging.getLogger("faust.transport.consumer").info("Assigned %d partitions", 3)
    logging.getLogger("mode.worker").debug("not at info")
    err = capsys.readouterr().err.splitlines()
    assert [orjson.loads(line)["message"] for line in err] == ["Assigned 3 partitions"]
    assert orjson.loads(err[0])["logger"] == "faust.transport.consumer"


def test_the_setting_chooses_the_format() -> None:
    assert Settings.from_env({**DEV_DEFAULTS, **base_env()}).log_format == "text"
    assert Settings.from_env({**DEV_DEFAULTS, **base_env(), "ORDERLY_LOG_FORMAT": "json"}).log_format == "json"
    from app.setting_kinds import SettingsError

    with pytest.raises(SettingsError, match="ORDERLY_LOG_FORMAT"):
        Settings.from_env({**DEV_DEFAULTS, **base_env(), "ORDERLY_LOG_FORMAT": "yaml"})


def base_env() -> dict[str, str]:
    return {"ORDERLY_KAFKA": "127.0.0.1:1", "ORDERLY_POSTGRES_DSN": "postgresql://x@127.0.0.1/x"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_writes_the_first_lines_per_key_then_one_count_of_the_rest() -> None:
    logger, stream = capture(logs.JsonFormatter())
    clock, suppressed = Clock(), list[tuple[str, ...]]()
    sampler = logs.SampledLog(logger, first=5, window_s=60.0, clock=clock, on_suppressed=suppressed.append)
    for i in range(10_000):
        clock.now = 1000.0 + i * 0.005  # 10,000 lines within 50 s: one window
        sampler.log(logging.WARNING, ("card", "unauthorized"), "401 card: %s", "no match", extra={"n": i})
    sampler.log(logging.WARNING, ("pg", "unauthorized"), "401 pg")  # another key has its own quota
    assert sampler.flush() == 0  # the window is not over yet
    assert [line["n"] for line in lines(stream) if "n" in line] == [0, 1, 2, 3, 4]
    assert len(suppressed) == 9_995 and set(suppressed) == {("card", "unauthorized")}

    clock.now = 1060.0
    assert sampler.flush() == 9_995
    report = lines(stream)[-1]
    assert (report["suppressed"], report["sample_key"], report["level"]) == (9_995, "card/unauthorized", "WARNING")
    assert report["message"] == "9995 more lines like this were suppressed in 60 s (card/unauthorized)"
    assert len(lines(stream)) == 5 + 1 + 1  # card's five, pg's one, the count; pg suppressed nothing: no line
    # a new window: five more lines again
    for _ in range(7):
        sampler.log(logging.WARNING, ("card", "unauthorized"), "401 again")
    assert [line["message"] for line in lines(stream)].count("401 again") == 5


def test_varied_keys_share_one_quota_past_the_limit() -> None:
    logger, stream = capture(logs.TextFormatter())
    sampler = logs.SampledLog(logger, first=2, window_s=60.0, max_keys=10, clock=Clock())
    for i in range(5_000):
        sampler.log(logging.WARNING, ("card", f"reason-{i}"), "line %d", i)
    assert len(stream.getvalue().splitlines()) == 10 + 2  # ten keys' one line each, then "other"'s two
    assert len(sampler._windows) == 11
