"""The web frontend: ``dsh web``, a bridge that serves a page and carries the JSON-RPC protocol
of docs/PROTOCOL.md between a browser's WebSocket and dshd's Unix socket (docs/WEB.md).

Theory of operation: the bridge runs as the user who started it and opens one dshd connection
per WebSocket, so dshd's own peer check (``SO_PEERCRED``) decides what the page may see; the
bridge only decides *who may reach it* (a token exchanged for a cookie, the ``Host`` and
``Origin`` checks). The page in ``static/`` is plain files: it speaks the protocol itself and
mirrors the lane with its own ``apply`` (``static/lane.js``), run over ``conformance/`` by the
tests.
"""
