"""``python -m client.cli``: the ``dsh`` command."""

from client.cli.main import main

main()
