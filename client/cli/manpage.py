"""Man pages of ``dsh`` from its click commands: ``python -m client.cli.manpage DIR`` writes
``dsh.1`` and one ``dsh-COMMAND.1`` per command into DIR (``make install-user`` /
``make install-system`` run it with the dsh they just installed).

Theory of operation: click-man (the ``man`` extra) renders a click command tree. It walks a
group's ``commands`` dict, which :class:`~client.cli.main.LazyGroup` fills only on demand, so
every command of ``COMMANDS`` is loaded first; then ``click_man.core.write_man_pages`` writes
the pages. Two things click-man leaves as click's help text and roff would misread are fixed
in its output (and the NAME line gets the whole first sentence, without a leading ``dsh:``, the
name it already starts with): click's ``\\b`` (no-rewrap) paragraphs become ``.nf`` ... ``.fi`` blocks, and a
line that begins with ``.`` or ``'`` is escaped (``\\&``). ``dsh.1`` gets an EXIT STATUS
section: the table of ``client.exits.EXIT_TABLE`` (``client.cli.help.exit_table_roff``).
The date is today's, or ``SOURCE_DATE_EPOCH``'s (click-man's rule), for reproducible builds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

import client
from client.cli.help import exit_table_roff
from client.cli.main import cli

__all__ = ["write_pages", "main"]

_ROFF_REQUEST = (".TH", ".SH", ".PP", ".TP", ".B ", ".nf", ".fi")


def _fix_roff(text: str) -> str:
    """Click's help text made safe for roff (module doc)."""
    out: list[str] = []
    nofill = False
    for line in text.split("\n"):
        if line == "\b":
            out.append(".nf")
            nofill = True
            continue
        if nofill and line in ("", ".PP"):
            out.append(".fi")
            nofill = False
        line = line.replace("\b", "")
        if line[:1] in ".'" and not line.startswith(_ROFF_REQUEST):
            line = "\\&" + line
        out.append(line)
    if nofill:
        out.append(".fi")
    return "\n".join(out)


def _whole_name(text: str, short_help: str) -> str:
    """The NAME line with the whole first sentence (click-man cuts it at 45 characters)."""
    head, sep, rest = text.partition(".SH NAME\n")
    line, nl, tail = rest.partition("\n")
    name = line.split(" \\- ", 1)[0]
    short_help = short_help.removeprefix("dsh: ")  # "dsh - dsh: run ..." says dsh twice
    return f"{head}{sep}{name} \\- {short_help.replace('-', chr(92) + '-')}{nl}{tail}"


def write_pages(target: Path) -> list[Path]:
    """Write every page of ``dsh`` into ``target``; the pages written."""
    try:
        from click_man.core import write_man_pages
    except ImportError:
        raise SystemExit("dsh: click-man is not installed: pip install 'dsh[man]'") from None
    target.mkdir(parents=True, exist_ok=True)
    ctx = click.Context(cli, info_name="dsh")
    for name in cli.list_commands(ctx):  # LazyGroup: load them so click-man sees them
        cli.get_command(ctx, name)
    write_man_pages("dsh", cli, version=client.__version__, target_dir=str(target))
    names = {"dsh.1": cli.get_short_help_str(limit=200)}
    names |= {f"dsh-{n}.1": cli.commands[n].get_short_help_str(limit=200) for n in cli.commands}
    pages = sorted(target / name for name in names)
    for page in pages:
        text = _fix_roff(_whole_name(page.read_text(encoding="utf-8"), names[page.name]))
        if page.name == "dsh.1":
            text = text.rstrip("\n") + "\n" + exit_table_roff()
        page.write_text(text, encoding="utf-8")
    return pages


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m client.cli.manpage DIR", file=sys.stderr)
        return 2
    for page in write_pages(Path(argv[0])):
        print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
