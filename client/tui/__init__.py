"""The terminal UI: ``dsh tui``, one Textual screen over the same protocol as every client.

Theory of operation: the app talks to dshd through ``client.api`` (anyio, running on Textual's
asyncio loop), mirrors each watched session's lane with ``protocol.mirror`` and renders only
the window a pane shows, never a call's whole history. Importing this package sets Textual's
frame cap before any of its modules loads Textual (``client.tui.frames``).
"""

from client.tui.frames import set_frame_cap

set_frame_cap()
