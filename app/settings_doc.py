"""docs/configuration.md's table of settings, rendered from app/settings.py's TABLE (documentation
tool; ``python -m app.settings_doc --readme docs/configuration.md``, run by ``make docs``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.setting_uses import PROCESSES
from app.settings import TABLE


def used_by(field: str) -> str:
    """The production processes that use a setting (app/setting_uses.py): those that require it when
    it is required, and `orderly check PROCESS` checks."""
    users = [name for name, fields in PROCESSES.items() if field in fields]
    return "every process" if len(users) == len(PROCESSES) else ", ".join(users) or "commands only"


def markdown_table() -> str:
    """docs/configuration.md's table, rendered from TABLE; each variable's row has an anchor (its
    name in lower case) that the refusals name."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    def code(text: str) -> str:
        return f"`{text}`" if text not in ("required", "unset") else text

    lines = ["| variable | accepts | default | `orderly dev` default (if other) | used by | meaning |",
             "|---|---|---|---|---|---|"]
    for row in TABLE:
        dev = code(row.dev) if row.dev is not None else ""
        name = f'<a id="{row.env.lower()}"></a>`{row.env}`' + (f" (or `{row.env}_FILE`)" if row.is_secret else "")
        lines.append(f"| {name} | {cell(row.kind.accepts)} | {code(row.text_default())} | {dev} "
                     f"| {used_by(row.field)} | {cell(row.description)} |")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- settings:begin -->\n", "<!-- settings:end -->"


def with_markdown_table(readme: str) -> str:
    """``readme`` with the text between its settings markers replaced by :func:`markdown_table`."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {BEGIN.strip()} … {END} section")
    return readme[: start + len(BEGIN)] + markdown_table() + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.settings_doc", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print the configuration table")
    parser.add_argument("--readme", type=Path, help="rewrite this file's section between the settings markers "
                                                    "(docs/configuration.md)")
    args = parser.parse_args(argv)
    if args.readme:
        text = args.readme.read_text(encoding="utf-8")
        args.readme.write_text(with_markdown_table(text), encoding="utf-8")
    if args.markdown or not args.readme:
        sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
