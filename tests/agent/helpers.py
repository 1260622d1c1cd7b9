"""Helpers of the agent-loop tests (client side; no fixtures here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

from dshd.config import ModelConfig
from dshd.testing import DshdProcess

#: Bound on every wait of these tests (a hang fails instead of blocking the suite).
WAIT_S = 60


def fast_model(url: str, **overrides) -> ModelConfig:
    """The openai-compatible provider at the fake server, with quick retries."""
    base = dict(provider="openai-compatible", base_url=url, model="fake-model-1",
                api_key_env="DSH_TEST_MODEL_KEY", max_retries=2, retry_initial_seconds=0.01,
                retry_max_seconds=0.05, request_timeout_seconds=30.0)
    base.update(overrides)
    return ModelConfig(**base)


def sandbox_mode(daemon) -> str:
    """workspace-write when this machine has a sandbox, else the explicit opt-out."""
    provider = daemon.sandbox.describe()["provider"]
    return "workspace-write" if provider != "none" else "danger-full-access"


async def approve_all(c, sid: str, decisions: list | None = None, *,
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Be the session's answerer (``c`` connected with approvals) and allow every request."""
    sub = await c.subscribe(sid)
    view = await sub.next_view()
    task_status.started(sub)
    done: set[str] = set()
    while True:
        for aid, entry in list(view["approvals"].items()):
            if aid in done:
                continue
            done.add(aid)
            r = await c.call("approval.decide",
                             {"sessionId": sid, "approvalId": aid, "decision": "allow"})
            if decisions is not None:
                decisions.append((entry["callId"], entry["summary"], r["outcome"]))
        view = await sub.next_view()


async def events_of(c, sid: str) -> list[dict]:
    return [e async for e in c.iter_events(sid)]


async def wait_turn_end(c, sid: str, turn_id: str) -> dict:
    """The turn/end event of ``turn_id`` (polls session.events, bounded)."""
    with trio.fail_after(WAIT_S):
        while True:
            for e in await events_of(c, sid):
                if e["type"] == "turn/end" and e["data"]["turnId"] == turn_id:
                    return e
            await trio.sleep(0.02)


async def wait_until(predicate, what: str = "condition") -> None:
    with trio.fail_after(WAIT_S):
        while not predicate():
            await trio.sleep(0.01)


def turn_events(events: list[dict], turn_id: str) -> list[dict]:
    """Events from the turn's turn/start through its turn/end."""
    start = next(i for i, e in enumerate(events)
                 if e["type"] == "turn/start" and e["data"]["turnId"] == turn_id)
    out = []
    for e in events[start:]:
        out.append(e)
        if e["type"] == "turn/end" and e["data"]["turnId"] == turn_id:
            break
    return out


def kill_session_processes(session_id: str) -> None:
    """SIGKILL the process groups of tool processes of ``session_id`` (left by a killed dshd):
    found by the DSH_SESSION_ID in their environment."""
    needle = f"DSH_SESSION_ID={session_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            os.killpg(os.getpgid(int(entry.name)), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def kill_call_hosts(state_dir: Path, session_id: str) -> int:
    """SIGKILL the live call hosts of ``session_id`` (``host.json``'s pid, its ``startTime``
    checked: a reused pid is never signalled), as a host dying while dshd is down; how many."""
    from dshd.execution.hostlink import host_alive, host_record

    killed = 0
    for call_dir in sorted((Path(state_dir) / "sessions" / session_id / "calls").glob("*")):
        record = host_record(call_dir)
        if host_alive(record):
            os.kill(int(record["pid"]), signal.SIGKILL)  # type: ignore[index]
            killed += 1
    return killed


class DaemonProcess(DshdProcess):
    """A real ``python -m dshd`` subprocess with a config file, for kill -9 and CLI tests."""

    def __init__(self, root: Path, config_text: str) -> None:
        self.config = root / "dshd.toml"
        self.config.write_text(config_text)
        super().__init__(root, extra_args=["--config", str(self.config)])
        self.env = dict(os.environ, DSH_SOCKET=str(self.socket))

    def dsh(self, *args: str, input: str | None = None, cwd=None) -> subprocess.CompletedProcess:
        """The real ``dsh`` CLI against this daemon."""
        return subprocess.run(
            [sys.executable, "-m", "client.cli", *args], env=self.env, cwd=cwd, input=input,
            capture_output=True, text=True, timeout=WAIT_S,
        )

def model_toml(model: ModelConfig | None) -> str:
    """The ``[model]`` table of a dshd.toml for ``model`` (None: no table, the defaults)."""
    if model is None:
        return ""
    lines = ["[model]"]
    for name in model.__struct_fields__:
        value = getattr(model, name)
        if value is not None:
            lines.append(f"{name} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"
