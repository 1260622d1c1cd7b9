"""Chat from the TUI's command line against a real dshd whose model is the scripted provider:
the answer streams into the session pane, and the model's call is answered by a key."""

from __future__ import annotations

import json

from client.tui.app import DshApp
from client.tui.panes import ApprovalsBar
from tests.tui.conftest import make_daemon, run_app, until

ANSWER = "Streaming the answer one word at a time for the TUI test."


def test_chat_input_streams_an_answer_and_a_model_call_is_approved_by_key(tui_root, workdir):
    script = tui_root / "script.jsonl"
    script.write_text(
        json.dumps({"text": ANSWER, "paceMs": 120, "toolCalls": [
            {"name": "bash", "arguments": {"command": "echo model >> m.txt"}}]}) + "\n"
        + json.dumps({"text": "Done."}) + "\n")
    daemon = make_daemon(tui_root, f'[model]\nprovider = "scripted"\nscript = "{script}"\n')
    daemon.start()
    try:
        assert daemon.dsh("run", "--name", "chat", "--", "true", cwd=str(workdir)).returncode == 0
        assert daemon.dsh("policy", "chat", "ask").returncode == 0
        texts: list[str] = []
        app = DshApp(socket=daemon.socket, session="chat")
        shown = app.feed_lane

        def record(session_id, lane):
            turn = (lane or {}).get("turn")
            if turn and turn.get("text") and (not texts or texts[-1] != turn["text"]):
                texts.append(turn["text"])
            shown(session_id, lane)

        app.feed_lane = record
        holder = {}

        async def scenario(pilot):
            await until(pilot, lambda: app.query_one("SessionPane").lane, "the lane")
            holder["session"] = app.feed.watched
            await pilot.press("colon")  # to the command line
            await pilot.press(*"> what is here?")
            await pilot.press("enter")
            bar = app.query_one(ApprovalsBar)
            await until(pilot, lambda: bar.approval is not None, "the model's call asked")
            assert bar.approval[1]["summary"] == "echo model >> m.txt"
            await until(pilot, bar.armed, "the request shown long enough to be answered")
            await pilot.press("f2")  # allow once, while the command line has the focus
            await until(pilot, lambda: (workdir / "m.txt").exists(), "the call ran")
            await until(pilot, lambda: not (app.query_one("SessionPane").lane or {}).get("turn"),
                        "the turn ended")

        run_app(app, scenario)
    finally:
        daemon.close()
    assert len(texts) >= 3, texts  # it grew batch by batch: streamed, not one block
    assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 2)), texts
    assert ANSWER in texts
    assert (workdir / "m.txt").read_text() == "model\n"
