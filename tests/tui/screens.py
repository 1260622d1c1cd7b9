"""Fixed values for the snapshot tests: a session list and a lane view with a running call
(ANSI colours in its output), a pending approval, recent results and a streaming turn."""

from __future__ import annotations

from protocol.methods import SessionInfo

SESSIONS = [
    SessionInfo(session_id="s-build", name="build", cwd="/home/dev/project", running=1,
                pending_approvals=1, last_exit=0, updated_at=2000, created_at=1000),
    SessionInfo(session_id="s-docs", name="docs", cwd="/home/dev/docs", running=0,
                pending_approvals=0, last_exit=2, updated_at=1500, created_at=900),
    SessionInfo(session_id="s-old", name=None, cwd="/tmp", running=0, pending_approvals=0,
                last_exit=None, updated_at=100, created_at=100),
]

OUTPUT = ("compiling dsh v0.1\n\x1b[32mok\x1b[0m protocol\n\x1b[32mok\x1b[0m client\n"
          "\x1b[31mFAIL\x1b[0m tests/tui::test_snapshot\n\x1b[1mrunning 3 more…\x1b[0m\n")

LANE = {
    "session": {"sessionId": "s-build", "title": "build", "cwd": "/home/dev/project",
                "approvalPolicy": "ask", "sandbox": "workspace-write", "name": "build"},
    "tools": {
        "c-make": {"name": "bash", "args": {"command": "make test"}, "state": "running",
                   "startedAt": 1000, "output": {"content": [{"type": "text", "text": OUTPUT}],
                                                 "details": {}, "truncation": {}}},
        "c-ask": {"name": "bash", "args": {"command": "rm -rf build/"},
                  "state": "waiting-approval", "startedAt": 1001,
                  "output": {"content": [{"type": "text", "text": ""}], "details": {},
                             "truncation": {}}},
    },
    "approvals": {"ap-1": {"callId": "c-ask", "tool": "bash", "summary": "rm -rf build/",
                           "askedAt": 1002}},
    "recent": [{"callId": "c-ls", "name": "bash", "isError": False, "exitCode": 0,
                "errorCode": None},
               {"callId": "c-grep", "name": "bash", "isError": True, "exitCode": 1,
                "errorCode": None}],
    "turn": {"turnId": "t-1", "state": "waiting-tools", "step": 1, "stepId": "s1",
             "text": "I will clean the build directory, then run the tests again.",
             "calls": [{"callId": "c-ask", "name": "bash", "state": "waiting-approval",
                        "exitCode": None, "errorCode": None}]},
}


async def feed(app) -> None:
    """Give an unconnected app the fixed values (``run_before`` of a snapshot)."""
    app.feed_sessions(SESSIONS)
    app.feed.watched = "s-build"
    app.feed_lane("s-build", LANE)
