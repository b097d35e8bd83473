"""A process's start imports what its command needs: the arguments of the other commands, some of
which import the admin's console or the simulator, are not built (about 0.4 s of every start, every
restart of every process, here). Each command still takes its own arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.cli import COMMANDS, main

HEAVY = ("app.admin.console", "app.admin.tokens", "app.simulator.cli", "app.admin.commands", "app.export")


def imported_by(*argv: str) -> set[str]:
    code = (f"import sys\nfrom app.cli import main\ntry:\n    main({list(argv)!r})\nexcept SystemExit:\n    pass\n"
            "print(' '.join(m for m in sys.modules if m.startswith('app.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return set(done.stdout.split())


@pytest.mark.parametrize("command", ["projector", "fetcher", "ingest", "worker"])  # effects has operator subcommands
def test_a_process_command_does_not_import_the_other_commands_modules(command: str) -> None:
    assert imported_by(command, "--help") & set(HEAVY) == set()


def test_each_command_still_takes_its_own_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, expected in ((["admin", "token", "--help"], "{create,list,revoke}"),
                           (["simulate", "--help"], "--histories"), (["dev", "--help"], "--brokers"),
                           (["export", "--help"], "--topic"), (["quarantine", "--help"], "usage: orderly quarantine")):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 0
        assert expected in capsys.readouterr().out, argv
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = capsys.readouterr().out
    assert all(name in listing for name in COMMANDS)


def test_the_top_level_parser_takes_no_option_with_a_value(capsys: pytest.CaptureFixture[str]) -> None:
    """What finding the command as the first argument that is no option rests on (app/cli.py main)."""
    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert usage == "usage: orderly [-h] [--version] COMMAND ...", usage
