"""app/setting_uses.py held to the code: each production process's fields are exactly those the
modules its `cmd_<process>` imports name (tests/integration/process_settings.py reads them from the
source); a command's are at least the required ones it reads, less the Kafka an operator command
that only reads PostgreSQL never reaches."""

from __future__ import annotations

import pytest

from app.setting_kinds import REQUIRED
from app.setting_uses import COMMANDS, KAFKA, PROCESSES, USES, uses
from app.settings import TABLE
from tests.integration.process_settings import fields_read

FIELDS = frozenset(row.field for row in TABLE)
REQUIRED_FIELDS = frozenset(row.field for row in TABLE if row.default is REQUIRED)
READS_ONLY = ("parked", "inspect", "gaps", "reconcile")  # PostgreSQL's view alone (app/admin/commands.py)
# Read at collection (tests/parsing.py: CPython 3.11's race between threads' parses).
READ = {name: fields_read(name) for name in [*PROCESSES, "quarantine", "replay", "export", *READS_ONLY]}


@pytest.mark.parametrize("process", PROCESSES)
def test_a_process_uses_exactly_what_its_code_reads(process: str) -> None:
    table, code = USES[process], READ[process]
    assert table == code, f"{process}: in the table only {sorted(table - code)}, read only {sorted(code - table)}"


@pytest.mark.parametrize("command", ["quarantine", "replay", "export", *READS_ONLY])
def test_a_command_uses_every_required_setting_it_reads(command: str) -> None:
    reads = READ[command] - (KAFKA if command in READS_ONLY else frozenset())
    assert reads & REQUIRED_FIELDS <= USES[command]
    assert "secrets" not in USES[command] and "api_token" not in USES[command]


def test_every_field_is_a_setting_and_the_default_is_every_process() -> None:
    assert all(fields <= FIELDS for fields in USES.values())
    assert set(COMMANDS).isdisjoint(PROCESSES)
    assert uses() == uses(*PROCESSES) and uses("parked") == {"postgres_dsn", "namespace"}
    with pytest.raises(KeyError):
        uses("ingset")


def test_only_the_ingest_uses_the_gateways_secrets_and_the_api_token() -> None:
    assert [name for name, fields in USES.items() if {"secrets", "api_token"} & fields] == ["ingest"]
