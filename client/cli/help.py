"""``dsh help``: the group's help, a command's help, or a topic (``exit-codes``).

Theory of operation: ``dsh help`` prints what ``dsh --help`` prints; ``dsh help COMMAND``
what ``dsh COMMAND --help`` prints (the group loads that one command, ``LazyGroup``);
``dsh help TOPIC`` a topic of :data:`TOPICS`. The one topic is ``exit-codes``: the
exit-status table of ``client.exits.EXIT_TABLE``, as aligned text (``--json``: a list of
rows; ``--markdown``: the README.md table, which tests/test_docs.py compares with this output, so the README cannot
drift from the code). The renderers here (:func:`exit_table_text`, :func:`exit_table_markdown`,
:func:`exit_table_roff`) are the only ones: the man page's EXIT STATUS section
(``client.cli.manpage``) uses the roff one. An unknown name is a usage error (exit 2) that
lists the commands and topics.
"""

from __future__ import annotations

import json
import re
from typing import Callable

import click
from click.shell_completion import CompletionItem

from client.exits import EXIT_TABLE, EXIT_TABLE_NOTE

__all__ = ["help_command", "TOPICS", "exit_table_text", "exit_table_markdown",
           "exit_table_roff", "exit_table_json"]

_CODE_SPAN = re.compile(r"`([^`]*)`")


def _label(codes: tuple[int, ...] | None, code_span: bool) -> str:
    if codes is None:
        return "N"
    return ", ".join(f"`{c}`" if code_span else str(c) for c in codes)


def exit_table_markdown() -> str:
    """README.md's table (the section's body), row for row from EXIT_TABLE."""
    lines = ["| status | meaning |", "|---|---|"]
    lines += [f"| {_label(codes, True)} | {meaning} |" for codes, meaning in EXIT_TABLE]
    return "\n".join(lines) + "\n\n" + EXIT_TABLE_NOTE + "\n"


def exit_table_text(width: int | None = None) -> str:
    """The table as aligned plain text (``dsh help exit-codes``)."""
    formatter = click.HelpFormatter(width=width)
    formatter.write_text("Exit status of dsh (README.md, \"dsh exit status\"):")
    formatter.write_paragraph()
    with formatter.indentation():
        formatter.write_dl([(_label(codes, False), _CODE_SPAN.sub(r"\1", meaning))
                            for codes, meaning in EXIT_TABLE], col_spacing=2)
    formatter.write_paragraph()
    formatter.write_text(EXIT_TABLE_NOTE)
    return formatter.getvalue()


def _roff(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in ".'" else text


def exit_table_roff() -> str:
    """The man page's EXIT STATUS section."""
    out = ['.SH "EXIT STATUS"']
    for codes, meaning in EXIT_TABLE:
        out += [".TP", f"\\fB{_roff(_label(codes, False))}\\fR",
                _roff(_CODE_SPAN.sub(r"\1", meaning))]
    out += [".PP", _roff(EXIT_TABLE_NOTE)]
    return "\n".join(out) + "\n"


def exit_table_json() -> str:
    """The table as JSON: ``[{"statuses": [int] | null, "meaning": str}]`` (null: N)."""
    rows = [{"statuses": list(codes) if codes is not None else None,
             "meaning": _CODE_SPAN.sub(r"\1", meaning)} for codes, meaning in EXIT_TABLE]
    return json.dumps(rows, ensure_ascii=False, indent=1) + "\n"


def _exit_codes(ctx: click.Context, form: str) -> str:
    if form == "markdown":
        return exit_table_markdown()
    return exit_table_json() if form == "json" else exit_table_text(ctx.terminal_width)


#: Topic -> (its one-line summary, its renderer: context, form "text"|"markdown"|"json").
TOPICS: dict[str, tuple[str, Callable[[click.Context, str], str]]] = {
    "exit-codes": ("every exit status of dsh and what it means", _exit_codes),
}


def _complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
    group = ctx.parent.command if ctx.parent else None
    names = list(group.list_commands(ctx.parent)) if isinstance(group, click.Group) else []
    items = [CompletionItem(n, help="command") for n in names]
    items += [CompletionItem(t, help=summary) for t, (summary, _) in TOPICS.items()]
    return [i for i in items if i.value.startswith(incomplete)]


HELP_HELP = """Show help: the commands (no NAME), a command's (NAME = a command, as
`dsh NAME --help`), or a topic.

\b
Topics:
""" + "\n".join(f"  {t:<12}{summary}" for t, (summary, _) in TOPICS.items())


@click.command("help", help=HELP_HELP,
               short_help="Show help: the commands, a command's, or a topic (exit-codes).")
@click.argument("name", required=False, metavar="[COMMAND|TOPIC]", shell_complete=_complete)
@click.option("--markdown", is_flag=True,
              help="exit-codes: print the table as Markdown (README.md's).")
@click.option("--json", "as_json", is_flag=True, help="exit-codes: print the table as JSON.")
@click.pass_context
def help_command(ctx: click.Context, name: str | None, markdown: bool, as_json: bool) -> None:
    group_ctx = ctx.parent
    assert group_ctx is not None and isinstance(group_ctx.command, click.Group)
    as_json = as_json or bool(getattr(ctx.obj, "json", False))  # dsh --json help exit-codes
    if (markdown or as_json) and name != "exit-codes":
        raise click.UsageError("--markdown and --json go with the exit-codes topic only", ctx)
    if markdown and as_json:
        raise click.UsageError("--markdown or --json, not both", ctx)
    if name is None:
        click.echo(group_ctx.get_help())
        return
    if name in TOPICS:
        form = "markdown" if markdown else "json" if as_json else "text"
        click.echo(TOPICS[name][1](ctx, form), nl=False)
        return
    command = group_ctx.command.get_command(group_ctx, name)
    if command is None:
        known = ", ".join([*group_ctx.command.list_commands(group_ctx), *TOPICS])
        raise click.UsageError(f"no command or help topic {name!r}; there are: {known}", ctx)
    with click.Context(command, info_name=name, parent=group_ctx) as sub:
        click.echo(command.get_help(sub))
