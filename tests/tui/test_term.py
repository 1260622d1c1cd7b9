"""TerminalScreen against a real daemon and a real PTY call, driven with Textual's Pilot.

Typed keys reach the program (a line read by bash comes back on its screen, with its
colours); the widget's size reaches the PTY (``stty size`` inside) on mount and after a
terminal resize; Ctrl-P alone goes to the program as typed, Ctrl-P Ctrl-Q detaches (the
screen is dismissed, the call goes on running) even though the app binds Ctrl-Q to quit.
"""

from __future__ import annotations

from client.api import connect
from client.tui.term import TerminalScreen, keys_to_bytes
from protocol.rpc import RpcError
from tests.e2e.conftest import daemon, workdir  # noqa: F401 - fixtures
from tests.tui.termsupport import ScreenHostApp, run_async, terminal_text, until


def test_keys_become_the_bytes_a_terminal_sends():
    assert keys_to_bytes("a", "a") == b"a"
    assert keys_to_bytes("enter", "\r") == b"\r"
    assert keys_to_bytes("backspace", "\x08") == b"\x7f"
    assert keys_to_bytes("up", None) == b"\x1b[A"
    assert keys_to_bytes("left", None) == b"\x1b[D"
    assert keys_to_bytes("ctrl+c", "\x03") == b"\x03"
    assert keys_to_bytes("ctrl+p", None) == b"\x10"
    assert keys_to_bytes("tab", "\t") == b"\t"
    assert keys_to_bytes("escape", "\x1b") == b"\x1b"
    assert keys_to_bytes("eacute", "é") == "é".encode()
    assert keys_to_bytes("f5", None) == b"\x1b[15~"


async def _tty_call(client, workdir, command: str) -> tuple[str, str]:
    sid = await client.create_session(workdir)
    result = await client.start_tool(sid, command, tty=(80, 24))
    return sid, result.call_id


async def _still_running(client, sid: str, cid: str) -> bool:
    try:
        await client.wait(sid, cid, timeout=0.5)
    except RpcError as exc:
        return exc.code == -32010  # tool.wait's timeout: the call goes on
    return False


def test_typed_keys_reach_the_program_and_its_answer_shows(daemon, workdir):
    async def main() -> None:
        async with connect(daemon.socket) as client:
            sid, cid = await _tty_call(
                client, workdir, "printf 'ready\\n'; read -r l; "
                                 "printf '\\033[32mgot:%s\\033[0m\\n' \"$l\"; sleep 60")
            screen = TerminalScreen(client, sid, cid)
            app = ScreenHostApp(screen)
            async with app.run_test(size=(80, 24)) as pilot:
                view = screen.terminal
                await until(lambda: "ready" in terminal_text(view), "ready", pilot=pilot)
                await pilot.press("h", "i", "space", "t", "h", "e", "r", "e", "enter")
                await until(lambda: "got:hi there" in terminal_text(view), "got:hi there",
                            pilot=pilot)
                row = next(y for y, line in enumerate(view.screen_model.display)
                           if "got:" in line)
                await pilot.pause(0.1)
                strip = view.render_line(row)
                colours = {seg.text.strip(): seg.style.color.number for seg in strip
                           if seg.text.strip() and seg.style and seg.style.color}
                assert colours.get("got:hi there") == 2, list(strip)  # SGR 32: green
                assert await _still_running(client, sid, cid)
                await client.cancel(sid, cid)
    run_async(main)


def test_size_reaches_the_pty_on_mount_and_on_resize(daemon, workdir):
    async def main() -> None:
        async with connect(daemon.socket) as client:
            sid, cid = await _tty_call(
                client, workdir, "printf 'ready\\n'; while read -r l; do "
                                 "echo \"size:$(stty size)\"; done")
            screen = TerminalScreen(client, sid, cid)
            # The attach screen's last row is its footer (how to detach): the PTY gets the rest.
            async with ScreenHostApp(screen).run_test(size=(100, 30)) as pilot:
                view = screen.terminal
                await until(lambda: "ready" in terminal_text(view), "ready", pilot=pilot)
                await until(lambda: view.size_sent == (100, 29), "the size sent", pilot=pilot)
                await pilot.pause(0.3)
                await pilot.press("enter")
                await until(lambda: "size:29 100" in terminal_text(view), "size:29 100",
                            pilot=pilot)
                await pilot.resize_terminal(120, 40)
                await until(lambda: view.size_sent == (120, 39), "the new size sent",
                            pilot=pilot)
                await pilot.pause(0.3)
                await pilot.press("enter")
                await until(lambda: "size:39 120" in terminal_text(view), "size:39 120",
                            pilot=pilot)
                assert (view.screen_model.columns, view.screen_model.lines) == (120, 39)
                await client.cancel(sid, cid)
    run_async(main)


def test_ctrl_p_ctrl_q_detaches_and_the_call_goes_on(daemon, workdir):
    async def main() -> None:
        async with connect(daemon.socket) as client:
            sid, cid = await _tty_call(
                client, workdir, "printf 'ready\\n'; read -r l; printf 'line:%q\\n' \"$l\"; "
                                 "sleep 60")
            screen = TerminalScreen(client, sid, cid)
            app = ScreenHostApp(screen)
            async with app.run_test(size=(80, 24)) as pilot:
                view = screen.terminal
                await until(lambda: "ready" in terminal_text(view), "ready", pilot=pilot)
                # Ctrl-P then another key: both go to the program as typed (docker's rule).
                await pilot.press("ctrl+p", "x", "enter")
                await until(lambda: "line:$'\\020x'" in terminal_text(view),
                            "Ctrl-P x as typed", pilot=pilot)
                assert app.screen is screen
                await pilot.press("ctrl+p", "ctrl+q")
                await until(lambda: app.results == ["detached"], "the screen dismissed",
                            pilot=pilot)
                assert app.screen is not screen and app.is_running, "the app did not quit"
                assert await _still_running(client, sid, cid)
                await client.cancel(sid, cid)
    run_async(main)
