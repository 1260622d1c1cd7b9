"""The ``dsh`` command (``client.cli.main``): ``python -m client.cli`` runs it too."""

from client.cli.main import cli, main

__all__ = ["cli", "main"]
