"""What the TUI tests read of the app and of the daemon's log."""

from __future__ import annotations

import sys
import subprocess
from typing import Any

import trio

from client.api import connect
from client.tui.app import DshApp
from client.tui.calls import CallView
from client.tui.panes import SessionsPane

#: A client that asks a call without pre-approving it (policy ask: it waits for an answerer),
#: prints its callId, then waits for its result and prints its exit code and error code.
ASKING_CLIENT = r"""
import sys, trio
from client.api import connect
async def main(session, command):
    async with connect(None) as c:
        call = await c.run_tool(session, command, approved=False, timeout=None)
        print(call, flush=True)
        result = await c.wait(session, call)
        print(result.exit_code, result.error_code, flush=True)
trio.run(main, sys.argv[1], sys.argv[2])
"""


def listed_names(app: DshApp) -> list[str]:
    table = app.query_one(SessionsPane)
    return [str(table.get_row(key)[0]) for key in table.rows]


def call_texts(app: DshApp) -> dict[str, str]:
    return {view.call_id: view.shown_output for view in app.query(CallView)}


def ask_from_outside(daemon: Any, session: str, command: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", ASKING_CLIENT, session, command],
                            env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def log_types(socket: Any, session: str) -> list[tuple[str, Any]]:
    """``(type, callId)`` of every event in the session's log (read with the real client)."""

    async def read() -> list[tuple[str, Any]]:
        found = []
        async with connect(socket) as client:
            async for raw in client.iter_records(session):
                import json
                event = json.loads(bytes(raw))
                found.append((event.get("type"), (event.get("data") or {}).get("callId")
                              or event.get("callId")))
        return found

    return trio.run(read)


#: Starts a pre-approved PTY call of ``cat`` (it keeps running) and prints its callId.
PTY_CLIENT = r"""
import sys, trio
from client.api import connect
async def main(session):
    async with connect(None) as c:
        print((await c.start_tool(session, "cat", tty=(80, 24))).call_id, flush=True)
trio.run(main, sys.argv[1])
"""


def start_pty_call(daemon: Any, session: str) -> str:
    r = subprocess.run([sys.executable, "-c", PTY_CLIENT, session], env=daemon.env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


async def answer(pilot: Any, app: DshApp, key: str) -> None:
    """Press ``key`` on the approvals bar as a person does: f6 to the bar, then the key once
    the request has been shown ``ARM_S`` (a condition, not a sleep)."""
    from client.tui.approvals import ApprovalsBar
    import time
    from tests.tui.conftest import BOUND_S
    bar = app.query_one(ApprovalsBar)
    deadline = time.monotonic() + BOUND_S
    while True:  # f6 again whenever something else took the focus meanwhile
        if not bar.has_focus_within:
            await pilot.press("f6")
        elif key == "v" or bar.armed():
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {BOUND_S} s: the bar focused and its request "
                                 f"armed (focus: {app.focused!r}; request shown: "
                                 f"{bar.approval is not None}, elsewhere: {bar.elsewhere}, "
                                 f"armed: {bar.armed()}, screen: {app.screen!r})")
        await pilot.pause(0.1)
    await pilot.press(key)


async def confirm(pilot: Any, app: DshApp, key: str = "y") -> None:
    """Answer the confirm screen with ``key`` once it is armed."""
    import time
    from client.tui.approvals import ARM_S
    from client.tui.confirm import ConfirmScreen
    from tests.tui.conftest import until
    await until(pilot, lambda: isinstance(app.screen, ConfirmScreen)
                and time.monotonic() - app.screen.shown_at >= ARM_S, "the confirm armed")
    await pilot.press(key)
