"""``dshd``: start the daemon (embedded defaults; optional TOML config)."""

from __future__ import annotations

import functools
import sys

import click
import trio

from .config import ConfigError, load_config
from .logging import configure


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML config file (default: $XDG_CONFIG_HOME/dsh/dshd.toml when present).")
@click.option("--socket", "socket", default=None, help="Unix socket path (or $DSH_SOCKET).")
@click.option("--state-dir", "state_dir", default=None, help="State directory (or $DSH_STATE_DIR).")
@click.option("--system", is_flag=True, default=False,
              help="System mode: /run/dsh/dshd.sock, /var/lib/dsh, group access.")
@click.option("--log-format", type=click.Choice(["auto", "console", "json"]), default=None)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None)
@click.version_option(package_name="dsh")
def main(config_path, socket, state_dir, system, log_format, log_level) -> None:
    """Run dshd, the durable agent-host daemon, in the foreground until SIGTERM/SIGINT;
    SIGHUP reloads the config file."""
    from .server import StartupError, serve

    # The same file and flags again on SIGHUP (dshd.config: reload).
    source = functools.partial(
        load_config, config_path, system=system, socket=socket, state_dir=state_dir,
        log_format=log_format, log_level=log_level,
    )
    try:
        config = source()
    except ConfigError as exc:
        click.echo(f"dshd: {exc}", err=True)
        sys.exit(2)
    configure(config.log_format, config.log_level)
    try:
        trio.run(functools.partial(serve, config, reload_config=source))
    except StartupError as exc:
        click.echo(f"dshd: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["fsck"]:  # `python -m dshd fsck --offline ...`: the offline log check
        from .storage.fsck_cli import main as fsck_main

        sys.exit(fsck_main(sys.argv[2:]))
    if sys.argv[1:2] == ["hosts"]:  # `python -m dshd hosts [--cancel]`: the live call hosts
        from .hosts_cli import main as hosts_main

        sys.exit(hosts_main(sys.argv[2:]))
    main()
