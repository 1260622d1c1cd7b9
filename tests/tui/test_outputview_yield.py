"""OutputView's redraw of new output yields to input (issue 17, the keypress latency under a
flood): while another widget's change (a key's effect) waits to be drawn, the output waits a
frame -- a bounded number of frames -- and then shows. Real daemon, real call; the incoming
bytes are handed to the view the way its follow hands them (``_receive``)."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Static

from client.api import connect
from client.tui.outputview import YIELD_FRAMES, OutputView
from tests.e2e.conftest import daemon, workdir  # noqa: F401 - fixtures
from tests.tui.termsupport import run_async, screen_lines, until


class Label(Static, can_focus=True):
    """The widget keys go to."""


class ViewAndLabel(App):
    CSS = "Static { height: 1; } OutputView { height: 1fr; }"

    def __init__(self, view: OutputView) -> None:
        super().__init__()
        self.view, self.label = view, Label("keys: 0")

    def compose(self) -> ComposeResult:
        yield self.label
        yield self.view

    def on_mount(self) -> None:
        self.label.focus()


def test_new_output_waits_for_a_pending_key_frame_then_shows(daemon, workdir):
    async def main() -> None:
        async with connect(daemon.socket) as client:
            sid = await client.create_session(workdir)
            cid = await client.run_tool(sid, "seq 1 3")
            await client.wait(sid, cid)
            view = OutputView(client, sid, cid)
            app = ViewAndLabel(view)
            async with app.run_test(size=(60, 12)) as pilot:
                await until(lambda: view.ended, "the short call followed", pilot=pilot)
                await pilot.pause()
                view._receive(view.position, b"fresh-output\n")
                app.label.update("keys: 1")  # a key's effect on the focused widget, not drawn
                view._tick()
                assert view._pending_bytes, "the output redrew in the key's frame"
                await until(lambda: any("fresh-output" in line
                                        for line in screen_lines(view)),
                            "the output shown after the key's frame", pilot=pilot)

                view._receive(view.position, b"more-output\n")
                for _ in range(YIELD_FRAMES + 1):  # the keys never stop: bounded wait
                    app.label.update(f"keys: {_}")
                    view._tick()
                assert not view._pending_bytes, "output waited without bound"
    run_async(main)
