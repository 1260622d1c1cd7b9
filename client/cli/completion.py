"""``dsh completion bash|zsh|fish``: print the shell's completion script for ``dsh``.

Theory of operation: click's shell completion does the work (``click.shell_completion``): the
script printed here makes the shell run ``dsh`` with ``_DSH_COMPLETE=<shell>_complete`` and
the words typed so far, and click answers with the commands, options and argument values
that fit -- session names and ids too, from the daemon, through the session argument type
(``client.cli.sessionref.SESSION_REF``; it completes nothing when the daemon does not
answer, never an error in the shell). The script is the one ``_DSH_COMPLETE=bash_source dsh``
prints; this command only saves knowing the variable. ``make install-user`` /
``make install-system`` install it where each shell looks (README.md, "Shell completion").
"""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

__all__ = ["completion", "SHELLS", "COMPLETE_VAR"]

#: The environment variable click's completion runs ``dsh`` with.
COMPLETE_VAR = "_DSH_COMPLETE"
SHELLS = ("bash", "zsh", "fish")


def completion_script(root: click.Command, shell: str) -> str:
    """The completion script of ``shell`` for ``dsh`` (the command ``root``)."""
    cls = get_completion_class(shell)
    if cls is None:  # SHELLS are click's own: a newer click without one is a bug here
        raise click.UsageError(f"click has no completion for {shell}")
    return cls(root, {}, "dsh", COMPLETE_VAR).source()


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish).

    \b
    Try it in this shell:   eval "$(dsh completion bash)"
                            source <(dsh completion zsh)
                            dsh completion fish | source
    Installed for good by make install-user / make install-system
    (README.md, "Shell completion").
    """
    try:
        click.echo(completion_script(ctx.find_root().command, shell), nl=False)
    except RuntimeError as exc:  # click refuses a bash older than 4.4
        raise click.ClickException(str(exc)) from None
