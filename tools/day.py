"""``make day``: a scripted day of use of dsh against a real dshd (issue 15, "Must show").

Theory of operation: one real ``python -m dshd`` in a temporary directory (its own socket and
state dir; a config with ``max_state_bytes`` and the ``scripted`` model provider), driven only
through the real ``dsh`` CLI as a person would, in rounds until ``--minutes`` (default 30) have
passed. A round: ``dsh run`` in several project directories (one of them writes a lot of
output, so the state grows and ``max_state_bytes`` has to act), named sessions reused by name,
a call detached with Ctrl-C then re-joined (``dsh attach``, ``dsh wait``), an approval
answered with a prefix rule that then allows the next call by itself (and is revoked),
a chat turn whose client dies mid-turn and is re-joined (``dsh chat --attach``), a
throw-away session removed (``dsh rm``), and ``dsh sessions``; then ``--pause`` seconds. At
the end it prints ``du -sh`` of the state dir before and after ``dsh prune --older-than`` a
third of the day, ``dsh sessions`` after it, and a summary.

Steps are written against the interfaces of ISSUE15's plan; a step whose command or option
this build does not have (asked of ``dsh COMMAND --help`` once) is SKIPPED with the missing
piece named, never run half. Exit status: 0 when every step passed and the state stayed under
its bound (sampled every round and at the end, ``du``'s apparent size, once retention had its
chance: ``Day.settled_state_bytes``); 1 when a step failed
or the bound was exceeded; skipped steps also fail the day unless ``--allow-missing`` (a
smoke run on a build where other rooms have not landed). Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dshd.config import Config  # noqa: E402  (after the path: run as a script)
from dshd.testing import DshdProcess  # noqa: E402

DSH = [sys.executable, "-m", "client.cli"]
SESSION_LINE = re.compile(r"session (\S+) call (\S+)")
RULE_ID = re.compile(r"\br-[0-9a-f]{12}\b")
#: Seconds a sample of the state over its bound waits for a retention pass (three of its 5 s
#: spacing, STORAGE.md §8) before the day calls the bound exceeded.
RETENTION_SETTLE_S = 15.0
#: A file the chat's tool call waits for (at most 60 s): the day creates it once the first
#: client is dead and the re-joined one answers, so the turn cannot end before the re-join.
CHAT_GATE = "chat-rejoined"
#: The chat's scripted model: a slow answer (the client is killed while it streams), a tool
#: call that waits for CHAT_GATE, then the closing text the re-joined client must show.
CHAT_SCRIPT = [
    {"text": " ".join(f"word{i}" for i in range(120)), "paceMs": 40,
     "toolCalls": [{"name": "bash", "arguments": {"command": (
         f"i=0; while [ ! -e {CHAT_GATE} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); "
         "done; echo chat-tool-ran")}}]},
    {"text": "All done for this turn.", "paceMs": 5},
]


class Missing(Exception):
    """A command or option of the plan that this build does not have (the step is skipped)."""


class StepFailed(Exception):
    pass


@dataclass
class Tally:
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: str | None = None


class Day:
    """The daemon, the CLI and the record of every step (module doc)."""

    def __init__(self, base: Path, bound: int) -> None:
        self.base = base
        self.bound = bound
        self.daemon: DshdProcess | None = None
        self.tally: dict[str, Tally] = {}
        self.helps: dict[str, str | None] = {}
        self.peak = 0
        self.instant_peak = 0
        self.notes: list[str] = []

    # -- the daemon ---------------------------------------------------------------------
    def start(self) -> None:
        script = self.base / "chat.jsonl"
        script.write_text("".join(json.dumps(r) + "\n" for r in CHAT_SCRIPT))
        lines = []
        if "max_state_bytes" in Config.__struct_fields__:
            lines.append(f"max_state_bytes = {self.bound}")
        else:
            self.notes.append("dshd has no max_state_bytes (room cleanup): the bound is only "
                              "checked here, nothing enforces it")
        lines += ["[model]", 'provider = "scripted"', f'script = "{script}"']
        (self.base / "dshd.toml").write_text("\n".join(lines) + "\n")
        self.daemon = DshdProcess(self.base, extra_args=["--config", str(self.base / "dshd.toml")])
        self.daemon.start()

    def close(self) -> None:
        if self.daemon is not None:
            self.daemon.close()

    # -- the CLI ------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        assert self.daemon is not None
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "DSH_STATE_DIR")}
        return dict(env, DSH_SOCKET=str(self.daemon.socket), PYTHONPATH=str(ROOT))

    def dsh(self, *args: str, cwd: Path, timeout: float = 120, stdin: str = "",
            want: int | None = 0) -> subprocess.CompletedProcess:
        """Run ``dsh ARGS``; with ``want`` its exit status must be that one."""
        r = subprocess.run([*DSH, *args], cwd=cwd, env=self.env(), input=stdin,
                           capture_output=True, text=True, timeout=timeout)
        if want is not None and r.returncode != want:
            raise StepFailed(f"dsh {' '.join(args)} exited {r.returncode} (wanted {want}): "
                             f"{(r.stderr or r.stdout).strip()[-400:]}")
        return r

    def spawn(self, *args: str, cwd: Path) -> subprocess.Popen:
        return subprocess.Popen([*DSH, *args], cwd=cwd, env=self.env(), text=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def need(self, command: str, *options: str) -> None:
        """Raise Missing unless ``dsh COMMAND`` exists with every one of ``options``."""
        if command not in self.helps:
            r = subprocess.run([*DSH, command, "--help"], env=self.env(), capture_output=True,
                               text=True, timeout=60)
            self.helps[command] = r.stdout if r.returncode == 0 else None
        text = self.helps[command]
        if text is None:
            raise Missing(f"dsh {command}")
        for option in options:
            if not re.search(rf"(^|[\s,\[]){re.escape(option)}\b", text):
                raise Missing(f"dsh {command} {option}")

    # -- steps --------------------------------------------------------------------------
    def step(self, name: str, body: Callable[[], str | None]) -> None:
        """Run one step and record it: ok, failed (why) or skipped (what is missing)."""
        tally = self.tally.setdefault(name, Tally())
        started = time.monotonic()
        try:
            detail = body() or ""
            tally.ok += 1
            status = "ok"
        except Missing as missing:
            tally.skipped = f"needs {missing}, not in this build"
            status, detail = "SKIPPED", tally.skipped
        except (StepFailed, subprocess.TimeoutExpired, AssertionError, OSError) as exc:
            tally.failed.append(str(exc))
            status, detail = "FAILED", str(exc)
        print(f"  {status:<7} {name:<16} {time.monotonic() - started:6.1f} s  {detail}",
              flush=True)

    def state_bytes(self) -> int:
        assert self.daemon is not None
        r = subprocess.run(["du", "-sb", str(self.daemon.state_dir)], capture_output=True,
                           text=True, check=True)
        size = int(r.stdout.split()[0])
        self.instant_peak = max(self.instant_peak, size)
        return size

    def settled_state_bytes(self) -> int:
        """The state once retention had its chance: dshd enforces ``max_state_bytes`` by
        passes that settled output wakes (at most one every 5 s, STORAGE.md §8), not at every
        write, so a sample taken just after a big call settled may be over; it is sampled
        again until under, for at most ``RETENTION_SETTLE_S``. The highest settled value is
        ``peak``; the highest instant one is printed beside it."""
        deadline = time.monotonic() + RETENTION_SETTLE_S
        size = self.state_bytes()
        while size > self.bound and time.monotonic() < deadline:
            time.sleep(0.5)
            size = self.state_bytes()
        self.peak = max(self.peak, size)
        return size

    def du_h(self) -> str:
        assert self.daemon is not None
        return subprocess.run(["du", "-sh", str(self.daemon.state_dir)], capture_output=True,
                              text=True, check=True).stdout.split()[0]


# ------------------------------------------------------------------------------ the steps
def session_of(r: subprocess.CompletedProcess | str) -> tuple[str, str]:
    """(session id, call id) from ``dsh run``'s stderr line."""
    text = r if isinstance(r, str) else r.stderr
    found = SESSION_LINE.search(text)
    if not found:
        raise StepFailed(f"no 'session ID call ID' line in: {text.strip()[-300:]}")
    return found.group(1), found.group(2)


def runs_in_dirs(day: Day, dirs: list[Path], n: int) -> str:
    for d in dirs:
        r = day.dsh("run", "--", "sh", "-c", f"echo round {n} in \"$PWD\"; seq 1 300", cwd=d)
        if f"round {n} in {d}" not in r.stdout or "\n300\n" not in r.stdout:
            raise StepFailed(f"dsh run in {d} printed {r.stdout[:200]!r}")
    big = day.dsh("run", "--", "sh", "-c", "head -c 393216 /dev/urandom | od -An -tx1",
                  cwd=dirs[0])
    return f"{len(dirs)} dirs + {len(big.stdout) // 1024} KiB of output"


def named_sessions(day: Day, dirs: list[Path], n: int) -> str:
    day.need("run", "--name")
    first = session_of(day.dsh("run", "--name", f"build-{dirs[1].name}", "--",
                               "sh", "-c", "echo build one", cwd=dirs[1]))[0]
    again = session_of(day.dsh("run", "--name", f"build-{dirs[1].name}", "--",
                               "sh", "-c", "echo build two", cwd=dirs[1]))[0]
    if first != again:
        raise StepFailed(f"--name made a second session ({first}, then {again})")
    return f"build-{dirs[1].name} = {first}"


def detach_attach(day: Day, dirs: list[Path], n: int) -> str:
    proc = day.spawn("run", "--", "sh", "-c", "echo started; sleep 3; echo finished", cwd=dirs[2])
    assert proc.stdout is not None and proc.stderr is not None
    if proc.stdout.readline().strip() != "started":
        proc.kill()
        raise StepFailed("dsh run printed nothing before the detach")
    proc.send_signal(signal.SIGINT)  # no terminal: Ctrl-C detaches, the command runs on
    _, err = proc.communicate(timeout=60)
    if proc.returncode != 130:
        raise StepFailed(f"Ctrl-C: dsh run exited {proc.returncode} (wanted 130): {err[-300:]}")
    sid, cid = session_of(err)
    shown = day.dsh("attach", sid, cwd=dirs[2], want=None, timeout=60)
    if shown.returncode != 0:
        raise StepFailed(f"dsh attach {sid} exited {shown.returncode}: {shown.stderr[-300:]}")
    waited = day.dsh("wait", sid, cid, cwd=dirs[2])
    if "finished" not in waited.stdout:
        raise StepFailed(f"dsh wait printed {waited.stdout[-200:]!r}")
    day.need("log")
    if "[SESSION]" in (day.helps.get("log") or ""):  # room names: the newest of this dir
        day.dsh("log", cwd=dirs[2])
    return f"{sid} re-joined"


def _pending(day: Day, cwd: Path, name: str) -> dict | None:
    r = day.dsh("approvals", "--json", cwd=cwd)
    data = json.loads(r.stdout or "[]")
    rows = data.get("approvals", []) if isinstance(data, dict) else data
    return next((a for a in rows if a.get("sessionName") == name), None)


def approvals_with_rules(day: Day, dirs: list[Path], n: int) -> str:
    day.need("run", "--ask-timeout", "--name")
    day.need("approvals", "--json")
    day.need("approve", "--allow-for-session", "--prefix")
    day.need("policy", "--rules", "--revoke")
    name, cwd = f"appr-{n}", dirs[3]
    proc = day.spawn("run", "--name", name, "--ask", "--ask-timeout", "60", "--",
                     "ls", "-la", cwd=cwd)
    deadline = time.monotonic() + 60
    asked = None
    while asked is None and time.monotonic() < deadline and proc.poll() is None:
        asked = _pending(day, cwd, name)
        time.sleep(0.2)
    if asked is None:
        proc.kill()
        raise StepFailed(f"no pending approval of {name} in dsh approvals ({proc.poll()})")
    day.dsh("approve", asked["sessionId"], asked["approvalId"], "--allow-for-session",
            "--prefix", "ls", cwd=cwd)
    _, err = proc.communicate(timeout=60)
    if proc.returncode != 0:
        raise StepFailed(f"the approved call exited {proc.returncode}: {err[-300:]}")
    # The rule allows the next `ls ...` with nobody there to ask.
    day.dsh("run", "--session", name, "--ask", "--ask-timeout", "5", "--", "ls", "-l", cwd=cwd)
    rules = day.dsh("policy", name, "--rules", cwd=cwd).stdout
    rule = RULE_ID.search(rules)
    if rule is None:
        raise StepFailed(f"dsh policy {name} --rules shows no rule: {rules[:200]!r}")
    day.dsh("policy", name, "--revoke", rule.group(0), cwd=cwd)
    day.dsh("run", "--session", name, "--ask", "--ask-timeout", "1", "--", "ls", cwd=cwd,
            want=125)  # revoked: nobody answers, so it never runs
    return f"rule {rule.group(0)} allowed, then revoked"


def read_until(stream, needle: str, timeout: float) -> str:
    """What ``stream`` (a pipe) printed up to and including ``needle``, read as it comes (an
    answer streams word by word without a newline, so ``readline`` would wait for its end).
    Raises StepFailed when the stream ends or ``timeout`` seconds pass first."""
    fd, seen = stream.fileno(), b""
    deadline = time.monotonic() + timeout
    while needle.encode() not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise StepFailed(f"no {needle!r} within {timeout:.0f} s: {seen[-300:]!r}")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise StepFailed(f"the output ended before {needle!r}: {seen[-300:]!r}")
        seen += chunk
    return seen.decode(errors="replace")


def chat_rejoin(day: Day, dirs: list[Path], n: int) -> str:
    """A chat's client dies mid-turn; ``dsh chat --attach`` (which re-joined it, and answers
    its approvals from then on) shows the turn to its end. No race with the answer's pace,
    however slow the machine: the re-join attaches while the first client still answers,
    and the turn's tool call waits for CHAT_GATE, created only after the first client died,
    so the turn is still running when the re-joined client takes over."""
    day.need("chat", "--attach", "--name")
    name, cwd = f"chat-{n}", dirs[0]
    (cwd / CHAT_GATE).unlink(missing_ok=True)
    first = day.spawn("chat", "--name", name, "--yes", "look around", cwd=cwd)
    back = None
    try:
        read_until(first.stdout, "word5", 120)  # the answer streams
        back = day.spawn("chat", "--attach", name, "--yes", cwd=cwd)
        err = read_until(back.stderr, "re-joining turn", 120)
        first.kill()  # the first client dies mid-turn
        first.wait(30)
        (cwd / CHAT_GATE).touch()
        out, rest = back.communicate(timeout=180)
    finally:
        for proc in (first, back):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)
    err += rest
    if back.returncode != 0 or "All done for this turn." not in out:
        raise StepFailed(f"the re-joined chat exited {back.returncode} without the turn's "
                         f"end: {out[-300:]!r} {err[-300:]!r}")
    if "chat-tool-ran" not in out:
        raise StepFailed(f"the re-joined chat did not answer the turn's tool call: "
                         f"{out[-300:]!r} {err[-300:]!r}")
    return f"{name} re-joined"


def remove_one(day: Day, dirs: list[Path], n: int) -> str:
    day.need("rm", "--force")
    sid, _ = session_of(day.dsh("run", "--", "true", cwd=dirs[1]))
    day.dsh("rm", sid, cwd=dirs[1])
    gone = day.dsh("log", sid, cwd=dirs[1], want=None)
    if gone.returncode == 0:
        raise StepFailed(f"dsh log {sid} still works after dsh rm")
    return f"{sid} removed"


def list_sessions(day: Day, dirs: list[Path], n: int) -> str:
    out = day.dsh("sessions", cwd=dirs[0]).stdout
    size = day.settled_state_bytes()
    if size > day.bound:
        raise StepFailed(f"the state is {size} bytes, over its bound of {day.bound} "
                         f"{RETENTION_SETTLE_S:g} s after the round")
    return f"{len(out.splitlines())} lines; state {size / 2**20:.1f} MiB"


STEPS: list[tuple[str, Callable[[Day, list[Path], int], str]]] = [
    ("runs", runs_in_dirs), ("named sessions", named_sessions),
    ("detach/attach", detach_attach), ("approval rules", approvals_with_rules),
    ("chat re-join", chat_rejoin), ("rm", remove_one), ("sessions", list_sessions),
]


# ------------------------------------------------------------------------------ the day
def finish(day: Day, dirs: list[Path], older_than: str) -> bool:
    """``dsh sessions``, ``du -sh`` around ``dsh prune``, the bound: True when within it."""
    listed = day.dsh("sessions", cwd=dirs[0], want=None).stdout.splitlines()
    print(f"\n== dsh sessions before dsh prune: {len(listed)} lines (printed after it)")
    before, before_b = day.du_h(), day.settled_state_bytes()
    print(f"\n== du -sh state dir before dsh prune: {before}  ({before_b} bytes)")

    def prune() -> str:
        day.need("prune", "--older-than", "--dry-run")
        lines = day.dsh("prune", "--older-than", older_than, cwd=dirs[0]).stdout.splitlines()
        deleted = sum(line.startswith("deleted ") for line in lines)
        skipped = sum(line.startswith("skipped ") for line in lines)
        return f"--older-than {older_than}: {deleted} deleted, {skipped} skipped"

    day.step("prune", prune)
    after_b = day.state_bytes()
    print(f"== du -sh state dir after dsh prune:  {day.du_h()}  ({after_b} bytes)")
    print("\n== dsh sessions (after prune)")
    print(day.dsh("sessions", cwd=dirs[0], want=None).stdout, end="")
    within = day.peak <= day.bound
    print(f"\nstate bound {day.bound} bytes; peak seen {day.peak} once retention had its "
          f"chance (at most {RETENTION_SETTLE_S:g} s): {'within' if within else 'EXCEEDED'}; "
          f"highest instant sample {day.instant_peak}")
    return within


def summary(day: Day, allow_missing: bool) -> int:
    print("\n== summary")
    failed = skipped = 0
    for name, t in day.tally.items():
        line = f"  {name:<16} ok {t.ok:>3}  failed {len(t.failed):>3}"
        if t.skipped:
            line += f"  skipped: {t.skipped}"
            skipped += 1
        print(line)
        for why in t.failed[:3]:
            print(f"      {why}")
        failed += len(t.failed)
    for note in day.notes:
        print(f"  note: {note}")
    if skipped and not allow_missing:
        print(f"  {skipped} step(s) skipped: merge the rooms that build them "
              "(or pass --allow-missing for a smoke run)")
    return 1 if failed or (skipped and not allow_missing) else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="how long the day lasts")
    ap.add_argument("--max-state-mib", type=int, default=48,
                    help="max_state_bytes of the daemon, MiB (the bound checked)")
    ap.add_argument("--pause", type=float, default=15.0,
                    help="seconds between rounds (a person reads what they ran)")
    ap.add_argument("--allow-missing", action="store_true",
                    help="a step whose command this build lacks is skipped, not a failure")
    args = ap.parse_args(argv)
    if not (0 < args.minutes <= 24 * 60 and 1 <= args.max_state_mib <= 1 << 20
            and 0 <= args.pause <= 600):
        ap.error("--minutes: 0 < N <= 1440; --max-state-mib: 1..1048576; --pause: 0..600")
    base = Path(tempfile.mkdtemp(prefix="dsh-day-", dir="/tmp"))
    day = Day(base, args.max_state_mib << 20)
    dirs = [base / "work" / p for p in ("web", "api", "docs", "infra")]
    for d in dirs:
        d.mkdir(parents=True)
        (d / "README").write_text(f"project {d.name}\n")
    try:
        day.start()
        end, n = time.monotonic() + args.minutes * 60, 0
        while n == 0 or time.monotonic() < end:
            n += 1
            print(f"== round {n} ({(end - time.monotonic()) / 60:.1f} min left)", flush=True)
            for name, body in STEPS:
                day.step(name, lambda body=body: body(day, dirs, n))
            time.sleep(max(0.0, min(args.pause, end - time.monotonic())))
        older = f"{max(30, int(args.minutes * 20))}s"  # idle for a third of the day
        within = finish(day, dirs, older)
        status = summary(day, args.allow_missing)
        return status if within else 1
    finally:
        day.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
