"""The `orderly` console script: one sub-command per process or operation."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from app.check import failure_line, start_checks, with_page
from app.process_setup import tune_gc, until_terminated, use_event_loop
from app.seams import UnsupportedVersion, check_versions
from app.setting_uses import USES
from app.settings import Settings, SettingsError, dev_settings
from app.settings_operator import operator_settings, stack_credentials
from topics.catalog import names


def _production_settings(process: str) -> Settings:
    """The settings ``process`` uses (app/setting_uses.py), all checked before it connects anywhere."""
    settings = Settings.from_env(uses=USES[process])
    start_checks(process, settings)
    return settings


def _operator_settings(command: str) -> Settings:
    """A hand-run command's settings; aiokafka's log kept out (one line says Kafka is down: app/check.py)."""
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    return operator_settings(uses=USES[command])


def use_logging(settings: Settings) -> None:
    """The process's log lines as ORDERLY_LOG_FORMAT says (app/logs.py), with its secrets kept out."""
    from app import logs

    logs.protect(logs.secrets_of(settings))
    logs.configure(settings.log_format)


def _process(process: str, run: Callable[[Settings], Any], first: Callable[[Settings], Any] | None = None,
             topics: bool = True) -> int:
    """A production process: settings from the environment, topics (unless ``topics`` is False)
    and migrations ensured (and ``first`` run), then run."""
    from app.bootstrap import prepare

    settings = _production_settings(process)
    use_logging(settings)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # until the loop logs its tasks on it: never an end
    use_event_loop(settings.event_loop)
    if settings.debug_sinks:
        logging.getLogger("orderly.sink").setLevel(logging.DEBUG)
    from aiokafka.errors import KafkaConnectionError

    try:
        asyncio.run(prepare(settings, topics))
    except KafkaConnectionError as exc:  # down, not refusing (that is a SettingsError with its reason)
        logging.getLogger("orderly").error("Kafka at %s is not reachable: %s; exiting for the supervisor to "
                                           "start this process again", settings.kafka_bootstrap, exc)
        return 1
    if first is not None:
        asyncio.run(first(settings))
    tune_gc(settings.gc_threshold)
    result = run(settings)
    if inspect.iscoroutine(result):
        asyncio.run(until_terminated(result))
    return 0


def _embedded_stack(run: Callable[[], int]) -> int:
    """Run the embedded stack; a port it cannot have ends it with what to do, not a traceback."""
    from app.stack.process import PortTakenError
    from app.supervisor import ShapeChangedError

    try:
        return run()
    except (PortTakenError, ShapeChangedError) as exc:
        print(f"orderly: {exc}", file=sys.stderr)
        return 1


def cmd_dev(args: argparse.Namespace) -> int:
    from app.stack.credentials import stack_settings
    from app.supervisor import run_dev

    settings, made = stack_settings(dict(os.environ))  # random credentials, each stack its own
    use_logging(settings)
    return _embedded_stack(lambda: run_dev(settings, brokers=args.brokers, workers=args.workers, made=made))


def cmd_demo(args: argparse.Namespace) -> int:
    from app.demo import Size, fetch_apis_argument, run_demo

    scale = args.scale if hasattr(args, "scale") else 1.0
    size = Size(scale)
    try:
        fetch_apis = fetch_apis_argument(getattr(args, "fetch_api", "404,truth"))
    except ValueError as exc:
        print(f"orderly demo: --fetch-api: {exc}", file=sys.stderr)
        return 2
    from app.stack.credentials import stack_settings

    settings, made = stack_settings(dict(os.environ))  # random credentials, each stack its own
    return _embedded_stack(lambda: run_demo(settings, size, keep=getattr(args, "keep", False),
                                            fetch_apis=fetch_apis, made=made))


def cmd_ingest(args: argparse.Namespace) -> int:
    from app.ingest.app import run

    return _process("ingest", run)


def cmd_worker(args: argparse.Namespace) -> int:
    from app.bootstrap import migrate_correlations
    from app.worker import run

    return _process("worker", run, migrate_correlations)  # the worker reads only orderly.raw


def cmd_projector(args: argparse.Namespace) -> int:
    from app.projector import run

    return _process("projector", run)


def cmd_effects(args: argparse.Namespace) -> int:
    if getattr(args, "action", None):
        from app.admin import commands

        return commands.main(commands.effects, _operator_settings("effects list"), args)
    from app.effects import run

    return _process("effects", run)


def cmd_admin(args: argparse.Namespace) -> int:
    if getattr(args, "action", None) == "token":
        from app.admin import commands, token_commands

        return commands.main(token_commands.run, _operator_settings("admin token"), args)
    from app.admin.app import run

    return _process("admin", run, topics=False)  # it serves PostgreSQL's view while Kafka is away: it starts then


def cmd_inspect(args: argparse.Namespace) -> int:
    from app.admin import commands

    return commands.main(commands.inspect, _operator_settings("inspect"), args)


def cmd_parked(args: argparse.Namespace) -> int:
    from app.admin import commands

    return commands.main(commands.parked, _operator_settings("parked"), args)


def cmd_gaps(args: argparse.Namespace) -> int:
    from app.admin import commands

    return commands.main(commands.gaps, _operator_settings("gaps"), args)


def cmd_fetcher(args: argparse.Namespace) -> int:
    from app.fetcher import run

    return _process("fetcher", run)


def cmd_reconcile(args: argparse.Namespace) -> int:
    from app.reconcile import run

    return asyncio.run(run(_operator_settings("reconcile")))


def cmd_replay(args: argparse.Namespace) -> int:
    from pathlib import Path

    from app.replay import replay

    settings = _operator_settings("replay")
    tune_gc(settings.gc_threshold)
    return replay(settings, args.into, Path(settings.data_dir) / "replay")


def cmd_simulate(args: argparse.Namespace) -> int:
    from app.simulator.cli import run

    # a running `orderly dev`'s credentials (its stack.json), the environment's over them
    return run(dev_settings({**stack_credentials(), **os.environ}), args)


def cmd_quarantine(args: argparse.Namespace) -> int:
    from app.admin import commands

    return commands.main(commands.quarantined, _operator_settings("quarantine"), args)


def cmd_export(args: argparse.Namespace) -> int:
    from app.export import run

    return run(_operator_settings("export"), args)


def cmd_migrate(args: argparse.Namespace) -> int:
    from app.bootstrap import migrate_correlations, prepare

    settings = _production_settings("migrate")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # it says itself, in one line, what failed
    created, applied = asyncio.run(prepare(settings))
    moved = asyncio.run(migrate_correlations(settings))
    print(f"topics created: {created or 'none'}; migrations applied: {applied or 'none'}; "
          f"correlations moved into {names(settings.namespace).raw}: {moved}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from app import check

    return check.run(args.processes, os.environ)


def _at_least_one(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number, not {text!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return number


COMMANDS = {
    "dev": (cmd_dev, "embedded Kafka + PostgreSQL and every process, data in .orderly/"),
    "demo": (cmd_demo, "the embedded stack driven by the gateway simulator, with the gateways' GET APIs answering "
                       "404 (the reducers alone) and then the truth; exit 0 only if every read model matches what "
                       "the gateways' documents expect"),
    "ingest": (cmd_ingest, "the HTTP ingest (webhooks, correlations, health, metrics)"),
    "worker": (cmd_worker, "the Faust stream processor: version guard, reducers, parking, effects"),
    "projector": (cmd_projector, "writes the PostgreSQL read models from orderly.decisions"),
    "effects": (cmd_effects, "records effects once in PostgreSQL and delivers them, signed, to ORDERLY_EFFECTS_URL; "
                             "`effects list` and `effects retry KEY` show and retry them"),
    "fetcher": (cmd_fetcher, "fetches payments whose events stayed parked too long (card GET /payments/{ref})"),
    "reconcile": (cmd_reconcile, "lists card payments whose row totals differ from their events; exit 1 if any"),
    "replay": (cmd_replay, "rebuild state, topics and read models from orderly.raw into a fresh namespace "
                           "and report every difference from the live one"),
    "simulate": (cmd_simulate, "the gateway simulator against an ingest: signed deliveries with retries, "
                               "duplicates and reordering; optionally serves the gateways' GET APIs; with --check, "
                               "seeded histories through the pure core (or --target's stack) against an oracle "
                               "built from the gateway documents"),
    "admin": (cmd_admin, "the admin API and the browser console on their own port (ORDERLY_ADMIN_PORT), "
                         "people signed in through OpenID Connect (docs/security.md); `admin token create|list|revoke` "
                         "manage personal API tokens"),
    "inspect": (cmd_inspect, "one resource: its state, its decision timeline and its effects"),
    "parked": (cmd_parked, "resources holding parked deliveries, oldest first, with why"),
    "gaps": (cmd_gaps, "open pg sequence gaps with their age and backfill status"),
    "quarantine": (cmd_quarantine, "records set aside by any stage: list, show one, or redrive one (append "
                                   "its body again where it was set aside from)"),
    "export": (cmd_export, "a projection topic (state, decisions, facts, effects) from its beginning to its end "
                           "now, read_committed, as a Parquet file with the topic's published schema "
                           "(docs/analytics.md)"),
    "check": (cmd_check, "check the settings of the processes named (default: all), then reach Kafka, PostgreSQL "
                         "and each URL; a line per check, exit 0 only if all pass (docs/configuration.md)"),
    "migrate": (cmd_migrate, "create the topics, apply the SQL migrations, move a pre-0.2 correlations topic "
                             "into orderly.raw, then exit"),
}


def _add_arguments(command: argparse.ArgumentParser, name: str) -> None:
    """The arguments of command ``name``: added to the one command being run only, as several import
    their modules (the admin's, the simulator's) that every other process would import for nothing
    at each start (about 0.3 s of a process's start here)."""
    if name == "dev":
        command.add_argument("--brokers", type=_at_least_one, default=1,
                             help="Kafka brokers (default 1, its own controller); more have a KRaft quorum of "
                                  "their own (3 controllers from 3 brokers on), and with 3 or more every topic, "
                                  "internal ones too, has 3 replicas and min.insync.replicas 2: the production "
                                  "shape (docs/production.md)")
        command.add_argument("--workers", type=_at_least_one, default=1,
                             help="worker processes in one consumer group (default 1); the partitions "
                                  "(ORDERLY_PARTITIONS) bound how many of them get work")
    if name == "demo":
        command.add_argument("--scale", type=float, default=1.0, help="resources per gateway, relative")
        command.add_argument("--keep", action="store_true",
                             help="after the truth table, keep the stack and the console running and print "
                                  "the console's URL and admin token (Ctrl-C stops)")
        command.add_argument("--fetch-api", default="404,truth", metavar="MODES",
                             help="one pass per mode, comma-separated, of how the gateways' GET APIs answer the "
                                  "fetcher: 404 (never: the reducers alone), truth (the final state), stale (one "
                                  "event behind); default 404,truth")
    if name == "admin":
        from app.admin.token_commands import add_token

        add_token(command)
    if name == "inspect":
        from app.admin.commands import add_inspect

        add_inspect(command)
    if name in ("parked", "gaps"):
        from app.admin.commands import add_limit

        add_limit(command)
    if name == "effects":
        from app.admin.commands import add_effects

        add_effects(command)
    if name == "simulate":
        from app.simulator.cli import add_arguments

        add_arguments(command)
    if name == "quarantine":
        from app.admin.commands import add_quarantine

        add_quarantine(command)
    if name == "export":
        from app.export import add_arguments as add_export

        add_export(command)
    if name == "check":
        command.add_argument("processes", nargs="*", metavar="PROCESS", help="a process or a command")
    if name == "replay":
        command.add_argument("--into", required=True, help="the fresh namespace to rebuild into")


def main(argv: list[str] | None = None) -> int:
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("orderly")
    except PackageNotFoundError:
        installed = "unknown (not installed)"
    parser = argparse.ArgumentParser(
        prog="orderly", description="Apply payment webhooks in gateway order.",
        epilog="Production processes read their settings from the environment (docs/configuration.md); "
               "operator commands also find a running `orderly dev` through .orderly/stack.json.")
    parser.add_argument("--version", action="version", version=f"orderly {installed}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    argv = sys.argv[1:] if argv is None else argv
    # the command: the first argument that is no option, as long as the top-level parser takes no
    # option with a value (--version and -h only; tests/unit/test_cli_start.py holds it)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (_fn, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        if name == chosen:
            _add_arguments(command, name)
    return _run(parser.parse_args(argv))


def _run(args: argparse.Namespace) -> int:
    """The command, after the version check; a refused setting or an unreachable Kafka or PostgreSQL
    is one line on stderr and exit 2 (docs/configuration.md), never a traceback."""
    try:  # before any command: the seams' use of library internals holds on the pinned versions only
        check_versions()
    except UnsupportedVersion as exc:
        print(f"orderly: {exc}", file=sys.stderr)
        return 2
    from app import logs

    logs.configure("text")  # until a process has its settings (use_logging)
    try:
        return COMMANDS[args.command][0](args)
    except SettingsError as exc:  # one line, the first refusal: `orderly check` lists every one
        first, *more = map(with_page, str(exc).split("\n"))
        also = f" (and {len(more)} more: `orderly check {args.command}` lists them)" if more else ""
        print(f"orderly: configuration error: {first}{also}", file=sys.stderr)
        return 2
    except Exception as exc:
        if (line := failure_line(exc)) is None:
            raise
        print(f"orderly {args.command}: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
