"""The terminal UI: ``dsh tui``, one Textual screen over the same protocol as every client.

Theory of operation: the app talks to dshd through ``client.api`` (anyio, running on Textual's
asyncio loop), mirrors each watched session's lane with ``protocol.mirror`` and renders only
the window a pane shows, never a call's whole history.
"""
