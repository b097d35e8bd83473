"""Settings from the environment: defaults, and refusals with a clear message."""

from __future__ import annotations

import pytest

from app.settings import DEV_DEFAULTS, Settings, SettingsError, dev_settings


def test_dev_defaults_build() -> None:
    s = dev_settings({})
    assert s.partitions == 12 and s.namespace == "orderly"
    assert s.secrets["pg"] == ("dev-pg-secret",)


def test_rotation_lists() -> None:
    s = Settings.from_env({**DEV_DEFAULTS, "ORDERLY_SECRET_PG": "new, old"})
    assert s.secrets["pg"] == ("new", "old")


@pytest.mark.parametrize("value", ["", " ", "a,,b", "a, "])
def test_empty_secret_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match=r"ORDERLY_SECRET_PAYMOS.*empty"):
        Settings.from_env({**DEV_DEFAULTS, "ORDERLY_SECRET_PAYMOS": value})


def test_missing_secret_is_refused() -> None:
    env = {k: v for k, v in DEV_DEFAULTS.items() if k != "ORDERLY_SECRET_CARD"}
    with pytest.raises(SettingsError, match="ORDERLY_SECRET_CARD is not set"):
        Settings.from_env(env)


@pytest.mark.parametrize(("name", "value"), [
    ("ORDERLY_PARTITIONS", "zero"), ("ORDERLY_PARTITIONS", "0"), ("ORDERLY_API_TOKEN", ""),
    ("ORDERLY_NAMESPACE", "1bad"), ("ORDERLY_PROCESSING_GUARANTEE", "maybe"), ("ORDERLY_GC_THRESHOLD", "-1"),
])
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({**DEV_DEFAULTS, name: value})


def test_to_env_round_trips() -> None:
    s = Settings.from_env({**DEV_DEFAULTS, "ORDERLY_SECRET_PG": "a,b", "ORDERLY_PARTITIONS": "5",
                           "ORDERLY_GC_THRESHOLD": "0"})
    assert s.gc_threshold == 0
    assert Settings.from_env(s.to_env()) == s


def test_read_timeout_defaults_to_10_s_and_round_trips() -> None:
    assert dev_settings({}).read_timeout_s == 10.0
    s = Settings.from_env({**DEV_DEFAULTS, "ORDERLY_READ_TIMEOUT_S": "0.25"})
    assert s.read_timeout_s == 0.25
    assert Settings.from_env(s.to_env()) == s


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
def test_read_timeout_must_be_a_finite_positive_number(value: str) -> None:
    with pytest.raises(SettingsError, match="ORDERLY_READ_TIMEOUT_S"):
        Settings.from_env({**DEV_DEFAULTS, "ORDERLY_READ_TIMEOUT_S": value})
