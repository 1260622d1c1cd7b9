"""The model's last message shows whole after its turn ends (issue 17, tuifix2 item 3).

The lane drops the turn -- and the last step's streaming text -- when the turn ends
(PROTOCOL.md §3.3), so the TUI kept the last partial text it saw ("Done: that was the
count") marked ``ended``. Now the ended turn's text is read from the log's
``message/assistant`` of that turn (``session.events``), like the web page does.
"""

from __future__ import annotations

import json

from client.tui.app import DshApp
from tests.tui.conftest import make_daemon, run_app, until

FINAL = "Done: that was the count of C files, every one of them counted twice over."


def test_the_final_text_shows_whole_after_the_turn_ends(tui_root, workdir):
    script = tui_root / "script.jsonl"
    # A first step with a call, then the final answer streamed fast: its last words and the
    # turn's end reach the lane together (the lane then has no turn, hence no text).
    script.write_text(
        json.dumps({"text": "Counting the files here now.", "paceMs": 200, "toolCalls": [
            {"name": "bash", "arguments": {"command": "ls | wc -l"}}]}) + "\n"
        + json.dumps({"text": FINAL}) + "\n")
    daemon = make_daemon(tui_root, f'[model]\nprovider = "scripted"\nscript = "{script}"\n')
    daemon.start()
    try:
        assert daemon.dsh("run", "--name", "fin", "--", "true", cwd=str(workdir)).returncode == 0
        assert daemon.dsh("policy", "fin", "never").returncode == 0  # the call just runs
        app = DshApp(socket=daemon.socket, session="fin")

        async def scenario(pilot):
            pane = app.query_one("SessionPane")
            await until(pilot, lambda: pane.lane, "the lane")
            await pilot.press("colon", *"> count them", "enter")
            await until(pilot, lambda: (pane.lane or {}).get("turn"), "the turn started")
            await until(pilot, lambda: not (pane.lane or {}).get("turn"), "the turn ended")
            turn = app.query_one("#turn")
            await until(pilot, lambda: "ended" in str(turn.render()), "marked ended")
            await until(pilot, lambda: FINAL in " ".join(str(turn.render()).split()),
                        "the whole final text shown", bound=10)

        run_app(app, scenario)
    finally:
        daemon.close()
