"""Kill -9 campaign: SIGKILL a real dshd at random moments and check what survives (issue 3).

Theory of operation: one campaign owns one short /tmp root (socket, state dir, workspace with
``markers/``) and runs ``iterations`` rounds of *start dshd → verify → workload → SIGKILL*,
then one last *start → verify → graceful stop → offline check*. Everything the client learns
is kept in a ledger; the checks compare the ledger, the marker files and the logs:

* **Acknowledged means durable.** A ``session.create`` response (header + settings flushed),
  a ``tool.wait`` response (the call's ``tool/result`` flushed) and a
  ``session.setApprovalPolicy`` response must survive every later kill. Stronger still: once a
  session has been opened after a restart (open = repair = flush), every event seen then is
  durable and must stay, byte for byte, at the front of the log forever.
* **The barrier.** Each call appends one line with its callId to ``markers/<callId>`` and then
  prints. A marker file present ⇒ that call's ``tool/call`` is in the log (the body starts only
  once ``tool/call`` is durable); an empty marker means the body was killed between opening
  the file and writing it. A call that settled with exit 0 ⇒ its marker has one line.
* **Never re-run.** No marker ever has more than one line; every callId has at most one
  ``tool/call`` and exactly one ``tool/result`` once the session is opened (crash repair closes
  the rest: ``TOOL_OUTCOME_UNKNOWN``, and ``TOOL_NOT_STARTED`` for calls the campaign announces
  in a ``message/assistant`` written into a dead daemon's log). After each restart ``tool.run``
  is re-sent with the callIds of calls that reached the log (it must name the existing call and
  not run it) and of calls that never became durable (retrying those is safe: they run now).
* **Logs open.** seq is dense from 0, no tracked session is listed ``damaged``, the offline
  reader never reports corruption, and after the final graceful stop no log is torn.

* **Calls outlive the daemon (issue 13).** A kill -9 leaves every running call in its call
  host (HOST.md §7): the next daemon re-adopts it or settles it from its exit record. So a
  call without a ``tool/result`` after a restart is legal while the daemon has it running
  (``tool.wait`` with a short timeout says so), and every such call must settle before the
  final check. Besides the short calls, every other round (and any round with fewer than two
  running) starts a **long call** (``sleep`` 12–20 s, then a random exit code); in half the rounds (the odd ones) the kill waits until
  at least one long call has been running for ``long_age`` (10) s -- by its marker's mtime,
  the moment its command started -- and is still running. After the restarts at least
  ``long_real_share`` (99%) of those calls must settle with their real exit code, none may
  run twice (its marker has one line) and none may be lost (no result at the end).

The kill lands at a uniformly random moment of the round (sometimes while the daemon still
opens and repairs the sessions). Tools are no longer killed after a kill: they run on and are
re-adopted. Only at the very end, every process whose command line or environment carries
the campaign's token is SIGKILLed, and every live call host under the state dir is ended
(:func:`end_live_hosts`). Use it from a test with a few iterations, or as a script:
``python tests/crash/campaign.py --iterations 300`` (exit status 1 when a violation was found).
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from client.api import connect
from protocol.mirror import MirrorBroken
from client.transport import DshClientError
from dshd.storage import SessionLog, read_log
from dshd.storage.errors import StorageError
from dshd.execution.hostlink import end_host, host_alive, host_record
from dshd.testing import DshdProcess
from protocol.rpc import TIMEOUT as WAIT_TIMEOUT, RpcError

OUTCOME_UNKNOWN = "TOOL_OUTCOME_UNKNOWN"
NOT_STARTED = "TOOL_NOT_STARTED"
#: Errors a client sees when the daemon dies under it.
CLIENT_GONE = (DshClientError, OSError, trio.BrokenResourceError, trio.ClosedResourceError)


# ----------------------------------------------------------------------------- processes
def marked_pids(token: str) -> list[int]:
    """Pids of live processes whose command line or environment contains ``token``.

    The environment catches what the command line misses: a shell that ``exec``s its last
    command drops the token from ``cmdline``, but the session's ``env`` (and ``DSH_CALL_ID``)
    is inherited by everything a tool starts.
    """
    needle = token.encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        for name in ("cmdline", "environ"):
            try:
                with open(f"/proc/{entry}/{name}", "rb") as f:
                    if needle in f.read():
                        pids.append(int(entry))
                        break
            except OSError:
                continue
    return pids


def kill_marked(token: str, timeout: float = 5.0) -> int:
    """SIGKILL the process group of every process carrying ``token``; wait until gone.

    Returns how many marked processes were found. Never signals our own process group.
    """
    own = os.getpgrp()
    found = marked_pids(token)
    deadline = time.monotonic() + timeout
    pids = found
    while pids:
        for pid in pids:
            try:
                pgid = os.getpgid(pid)
                if pgid != own:
                    os.killpg(pgid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
        pids = marked_pids(token)  # zombies have an empty cmdline: they drop out here
    return len(found)


def end_live_hosts(state_dir: Path) -> int:
    """End every *live* call host under ``state_dir`` (``hostlink.end_host``); how many.
    (``DshdProcess.close`` also sweeps the token carriers of every dead host, one ``/proc``
    scan per call dir: minutes for a campaign's thousands of calls; ``kill_marked`` sweeps
    the campaign's token once instead.)"""
    ended = 0
    for call_dir in sorted(Path(state_dir).glob("sessions/*/calls/*")):
        if host_alive(host_record(call_dir)):
            ended += end_host(call_dir)
    return ended


# ----------------------------------------------------------------------------- ledger
@dataclass
class SessionRecord:
    sid: str
    born: int
    #: callId -> command, for every tool.run the campaign sent (answered or not).
    sent: dict[str, str] = field(default_factory=dict)
    #: callId -> ToolResult a tool.wait answered: durable by contract.
    acked: dict[str, dict] = field(default_factory=dict)
    #: session.setApprovalPolicy responses received.
    policy_acks: int = 0
    #: Every event seen right after an open (all durable then): the log's permanent prefix.
    durable: list[dict] = field(default_factory=list)
    #: callIds announced in a message/assistant the campaign wrote into the log.
    announced: set[str] = field(default_factory=set)
    #: callIds whose repair result was already counted.
    counted: set[str] = field(default_factory=set)
    #: callIds with a tool/call and no tool/result at the last open: running (re-adopted).
    pending: set[str] = field(default_factory=set)
    dirty: bool = True


@dataclass
class LongCall:
    """A long call: its session, the exit code it must settle with, how long it sleeps."""

    sid: str
    code: int
    seconds: int
    #: time.time() when its tool.run was answered (its tool/call durable).
    sent_at: float = 0.0
    #: Its tool/result was seen (by its waiter or by a verification after a restart).
    settled: bool = False


@dataclass
class Summary:
    iterations: int = 0
    kills: int = 0
    kills_while_opening: int = 0
    sessions: int = 0
    calls_sent: int = 0
    calls_acked: int = 0
    results_checked: int = 0
    outcome_unknown: int = 0
    not_started: int = 0
    retried_existing: int = 0
    retried_fresh: int = 0
    torn_tails_seen: int = 0
    leftover_tools_killed: int = 0
    stream_batches: int = 0
    orphan_session_dirs: int = 0
    markers: int = 0
    long_calls: int = 0
    long_kills: int = 0
    long_hit: int = 0
    long_real: int = 0
    long_unknown: int = 0
    long_twice: int = 0
    long_lost: int = 0
    adopted_seen: int = 0
    seconds: float = 0.0
    stopped_early: bool = False
    violations: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"iterations={self.iterations} kills={self.kills} "
            f"(while verifying: open + repair + re-sends: {self.kills_while_opening}) "
            f"seconds={self.seconds:.1f}",
            f"sessions={self.sessions} calls sent={self.calls_sent} acked={self.calls_acked} "
            f"results checked={self.results_checked} markers={self.markers}",
            f"repaired: TOOL_OUTCOME_UNKNOWN={self.outcome_unknown} "
            f"TOOL_NOT_STARTED={self.not_started}; torn tails seen={self.torn_tails_seen}",
            f"re-sent tool.run: existing (not re-run)={self.retried_existing} "
            f"never durable (ran now)={self.retried_fresh}",
            f"leftover tool processes killed={self.leftover_tools_killed} "
            f"stream batches={self.stream_batches} orphan session dirs={self.orphan_session_dirs}",
        ]
        share = f"{100.0 * self.long_real / self.long_hit:.1f}%" if self.long_hit else "n/a"
        out.append(
            f"long calls: started={self.long_calls} kills while one ran >= 10 s="
            f"{self.long_kills} calls running >= 10 s at a kill={self.long_hit}: settled with "
            f"their real exit code={self.long_real} ({share}) TOOL_OUTCOME_UNKNOWN="
            f"{self.long_unknown} ran twice={self.long_twice} lost={self.long_lost}; "
            f"calls still running after a restart (re-adopted)={self.adopted_seen}")
        if self.stopped_early:
            out.append("INCOMPLETE: stopped at the time budget")
        out.append(f"violations={len(self.violations)}")
        out += [f"  VIOLATION {v}" for v in self.violations[:25]]
        return out


# ----------------------------------------------------------------------------- campaign
class Campaign:
    def __init__(
        self,
        root: Path,
        *,
        seed: int,
        max_kill_delay: float = 1.0,
        working_set: int = 3,
        workers_per_session: int = 2,
        iteration_timeout: float = 60.0,
        long_age: float = 10.0,
        long_real_share: float = 0.99,
        progress: int = 0,
        log=print,
    ) -> None:
        self.root = Path(root)
        self.rng = random.Random(seed)
        self.seed = seed
        self.max_kill_delay = max_kill_delay
        self.working_set = working_set
        self.workers_per_session = workers_per_session
        self.iteration_timeout = iteration_timeout
        self.long_age = long_age
        self.long_real_share = long_real_share
        #: callId -> LongCall, and the long calls that ran >= long_age s at some kill.
        self.long: dict[str, LongCall] = {}
        self.long_hit: set[str] = set()
        #: callId -> its tool/result, from the offline read after the final stop.
        self.final_results: dict[str, dict] = {}
        self.log = log
        self.progress = progress
        self.token = "dshcrash" + secrets.token_hex(6)
        self.work = self.root / "work"
        self.markers = self.work / "markers"
        self.markers.mkdir(parents=True, exist_ok=True)
        self.daemon = DshdProcess(self.root)
        self.sessions: dict[str, SessionRecord] = {}
        self.summary = Summary()
        self._opening = False
        self._n = 0

    # -- helpers ---------------------------------------------------------------------
    def violation(self, text: str) -> None:
        self.summary.violations.append(f"[it {self.summary.iterations}] {text}")
        if self.progress:
            self.log(f"  VIOLATION {self.summary.violations[-1]}")

    def marker_lines(self, cid: str) -> list[str] | None:
        try:
            return (self.markers / cid).read_text().splitlines()
        except FileNotFoundError:
            return None

    def new_call(self, rec: SessionRecord, it: int, worker: int) -> tuple[str, str]:
        self._n += 1
        cid = f"i{it}w{worker}n{self._n}{secrets.token_hex(2)}"
        mark = f"printf '%s\\n' {cid} >> {self.markers}/{cid}"
        out = f"echo out-{cid}"
        r = self.rng.random()
        if r < 0.45:
            body = f"{mark}; {out}"
        elif r < 0.7:
            body = f"{mark}; sleep 0.0{self.rng.randint(1, 9)}; {out}"
        elif r < 0.85:
            body = f"{mark}; seq 1 {self.rng.randint(100, 5000)}; {out}"
        else:
            body = f"echo started-{cid}; sleep 0.{self.rng.randint(1, 5)}; {mark}; {out}"
        return cid, f"{body}; : {self.token}"

    # -- the whole campaign ------------------------------------------------------------
    async def run(self, iterations: int, max_seconds: float | None = None) -> Summary:
        started = time.monotonic()
        try:
            for it in range(iterations):
                if max_seconds is not None and time.monotonic() - started > max_seconds:
                    self.summary.stopped_early = True
                    break
                self.summary.iterations = it + 1
                with trio.move_on_after(self.iteration_timeout) as scope:
                    await self.iteration(it)
                if scope.cancelled_caught:
                    self.violation(f"iteration did not finish in {self.iteration_timeout} s "
                                   f"(daemon hung?)\n{self.daemon.log_tail(10)}")
                if self.progress and (it + 1) % self.progress == 0:
                    s = self.summary
                    self.log(f"  {it + 1}/{iterations} kills={s.kills} acked={s.calls_acked} "
                             f"unknown={s.outcome_unknown} violations={len(s.violations)} "
                             f"{time.monotonic() - started:.0f}s")
                self.daemon.kill9()
            await self.final_check()
        finally:
            self.daemon.kill9()
            end_live_hosts(self.daemon.state_dir)
            self.summary.leftover_tools_killed += kill_marked(self.token)
            self.summary.seconds = time.monotonic() - started
            self.summary.sessions = len(self.sessions)
        return self.summary

    async def iteration(self, it: int) -> None:
        self.daemon.start()
        # Mostly anywhere in the round; sometimes early, while sessions open and repair.
        if self.rng.random() < 0.15:
            delay = self.rng.uniform(0, 0.05)
        else:
            delay = self.rng.uniform(0, self.max_kill_delay)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.drive, it)
            await trio.sleep(delay)
            if it % 2 == 1:  # half the rounds: kill while a long call has run >= long_age s
                hit = await self.wait_for_old_long_calls()
                self.long_hit |= hit
                self.summary.long_kills += 1 if hit else 0
            self.daemon.kill9()
            self.summary.kills += 1
            if self._opening:
                self.summary.kills_while_opening += 1
            await trio.sleep(0.05)  # responses already on the wire still count
            nursery.cancel_scope.cancel()
        await self.after_kill(it)

    def long_running(self) -> int:
        """How many durable long calls are not settled and have time left (or are about to start:
        durable for less than 5 s without its marker; one that never started settles
        ``TOOL_OUTCOME_UNKNOWN``, and a verification marks it settled)."""
        now, running = time.time(), 0
        for cid, call in self.long.items():
            rec = self.sessions.get(call.sid)
            if rec is None or cid in rec.acked or call.settled:
                continue
            try:
                running += now < (self.markers / cid).stat().st_mtime + call.seconds - 2.0
            except FileNotFoundError:
                running += now - call.sent_at < 5.0
        return running

    def old_long_calls(self) -> set[str]:
        """Long calls whose command has run >= long_age s (marker mtime) and still runs (it
        sleeps a whole number of seconds more; a margin of 1 s for the kill to land)."""
        now, found = time.time(), set()
        for cid, call in self.long.items():
            rec = self.sessions.get(call.sid)
            if rec is None or cid in rec.acked or call.settled:
                continue
            try:
                started = (self.markers / cid).stat().st_mtime
            except FileNotFoundError:
                continue
            if now - started >= self.long_age and now < started + call.seconds - 1.0:
                found.add(cid)
        return found

    async def wait_for_old_long_calls(self) -> set[str]:
        """Wait (bounded: the round's budget less 20 s) until a long call is old enough."""
        bound = max(self.iteration_timeout - 20.0, self.long_age + 10.0)
        with trio.move_on_after(bound):
            while not (hit := self.old_long_calls()):
                await trio.sleep(0.05)
            return hit
        self.violation(f"no long call reached {self.long_age} s within {bound} s "
                       "(none started?)")
        return set()

    async def after_kill(self, it: int) -> None:
        """While the daemon is dead: read the logs (never corrupt), sometimes announce a call."""
        for rec in self.sessions.values():
            if not rec.dirty:
                continue
            try:
                read = read_log(self.daemon.state_dir / "sessions" / rec.sid, rec.sid)
            except FileNotFoundError:
                self.violation(f"{rec.sid}: acknowledged session has no log after the kill")
                continue
            except StorageError as exc:
                self.violation(f"{rec.sid}: log unreadable after kill: {exc}")
                continue
            if read.torn:
                self.summary.torn_tails_seen += 1
        live = [r for r in self.sessions.values() if r.dirty]
        if live and self.rng.random() < 0.2:
            await self.announce(self.rng.choice(live), it)

    async def announce(self, rec: SessionRecord, it: int) -> None:
        """Write a ``message/assistant`` naming a tool call into a dead daemon's log (the agent
        loop would): the next open must close it ``TOOL_NOT_STARTED``."""
        cid = f"na{it}x{secrets.token_hex(3)}"
        try:
            log = await SessionLog.open_for_write(self.daemon.state_dir, rec.sid, repair=False)
        except StorageError as exc:
            self.violation(f"{rec.sid}: cannot open the log of a dead daemon: {exc}")
            return
        try:
            log.append("message/assistant", {"text": "calling a tool", "toolCalls": [
                {"callId": cid, "name": "bash", "arguments": '{"command": "true"}'}]})
            await log.flush()
        finally:
            await log.aclose()
        rec.announced.add(cid)
        # What this handle wrote (and the torn tail it fixed) is durable now.
        rec.dirty = True

    # -- one round against a live daemon ------------------------------------------------
    async def drive(self, it: int) -> None:
        try:
            self._opening = True
            await self.verify(it)
            self._opening = False
            await self.workload(it)
        except* CLIENT_GONE:
            pass
        except* RpcError as group:
            if self.daemon.running:
                for exc in group.exceptions:
                    self.violation(f"unexpected RPC error while the daemon ran: {exc!r}")

    async def verify(self, it: int, *, final: bool = False, settled: bool = False) -> None:
        targets = [r for r in self.sessions.values() if r.dirty or final]
        if not targets:
            return
        async with connect(self.daemon.socket, "crash-campaign") as c:
            # session.list reads every log that is not open: every 10th round, and at the end.
            if final or it % 10 == 0:
                infos = {i["sessionId"]: i for i in await c.list_sessions()}
                for rec in self.sessions.values():
                    info = infos.get(rec.sid)
                    if info is None:
                        self.violation(f"{rec.sid}: acknowledged session missing from session.list")
                    elif "damaged" in info:
                        self.violation(f"{rec.sid}: listed damaged: {info['damaged']}")
            for rec in targets:
                await self.verify_session(c, rec, it, settled=settled)

    async def check_running(self, c, rec: SessionRecord, cid: str) -> None:
        """A call with no result after a restart must be running in the daemon (re-adopted):
        ``tool.wait`` with a short timeout answers -32010, or its result if it just ended."""
        try:
            await c.wait(rec.sid, cid, timeout=0.01)
        except RpcError as exc:
            if exc.code != WAIT_TIMEOUT:
                self.violation(f"{rec.sid}: call {cid} has no tool/result and is not running: "
                               f"{exc.code} {exc.message}")
                return
        rec.pending.add(cid)
        self.summary.adopted_seen += 1

    async def verify_session(self, c, rec: SessionRecord, it: int, *,
                             settled: bool = False) -> None:
        sid = rec.sid
        try:
            await c.get_session(sid)  # opens for write: torn-tail fix + repair closers, flushed
        except RpcError as exc:
            self.violation(f"{sid}: cannot be opened after restart: {exc.code} {exc.message}")
            rec.dirty = False
            return
        events = [ev async for ev in c.iter_events(sid)]
        seqs = [ev["seq"] for ev in events]
        if seqs != list(range(len(seqs))):
            self.violation(f"{sid}: seq not dense from 0: {seqs[:5]}…")
        if events[: len(rec.durable)] != rec.durable:
            at = next((i for i, (a, b) in enumerate(zip(events, rec.durable)) if a != b),
                      min(len(events), len(rec.durable)))
            self.violation(f"{sid}: durable prefix changed at seq {at} "
                           f"(had {len(rec.durable)} durable events, log has {len(events)})")
        if [e["type"] for e in events[:3]] != ["session/owner", "approval/policy", "sandbox/mode"]:
            self.violation(f"{sid}: acknowledged session.create settings missing")
        calls: dict[str, int] = {}
        results: dict[str, list[dict]] = {}
        policies = 0
        for ev in events:
            d = ev["data"]
            if ev["type"] == "tool/call":
                calls[d["callId"]] = calls.get(d["callId"], 0) + 1
            elif ev["type"] == "tool/result":
                results.setdefault(d["callId"], []).append(d)
            elif ev["type"] == "approval/policy" and d.get("source") == "session.setApprovalPolicy":
                policies += 1
        if policies < rec.policy_acks:
            self.violation(f"{sid}: {rec.policy_acks} policy changes acknowledged, {policies} in log")
        rec.pending = set()
        for cid, n in calls.items():
            if n != 1:
                self.violation(f"{sid}: call {cid} has {n} tool/call events (re-run?)")
            if not results.get(cid) and not settled:
                await self.check_running(c, rec, cid)
            elif len(results.get(cid, [])) != 1:
                self.violation(f"{sid}: call {cid} has {len(results.get(cid, []))} tool/result")
        for cid, rs in results.items():
            if cid not in calls and cid not in rec.announced:
                self.violation(f"{sid}: tool/result for unknown call {cid}")
        for cid in rec.announced:
            rs = results.get(cid, [])
            if len(rs) != 1 or rs[0].get("errorCode") != NOT_STARTED:
                self.violation(f"{sid}: announced call {cid} not closed TOOL_NOT_STARTED: {rs}")
        for cid, acked in rec.acked.items():
            if cid not in calls:
                self.violation(f"{sid}: acknowledged call {cid} lost its tool/call")
            elif results.get(cid, [None])[0] != acked:
                self.violation(f"{sid}: acknowledged result of {cid} differs: "
                               f"{results.get(cid)} != {acked}")
        for cid in rec.sent:
            lines = self.marker_lines(cid)
            res = (results.get(cid) or [None])[0]
            if lines is not None:
                if cid not in calls:
                    self.violation(f"{sid}: marker of {cid} exists but its tool/call is not durable")
                if lines not in ([cid], []):  # empty: killed between open and write
                    self.violation(f"{sid}: marker of {cid} has {len(lines)} lines: {lines[:3]}")
            if res is not None and res.get("exitCode") == 0 and not res.get("errorCode"):
                if lines != [cid]:
                    self.violation(f"{sid}: {cid} settled exit 0 but marker is {lines}")
                if f"out-{cid}" not in res.get("content", ""):
                    self.violation(f"{sid}: {cid} settled exit 0 without its output")
            elif res is not None and res.get("errorCode") not in (OUTCOME_UNKNOWN, None):
                self.violation(f"{sid}: {cid} settled unexpectedly: {res.get('errorCode')} "
                               f"{res.get('content', '')[:200]}")
        for cid, rs in results.items():
            if cid in self.long:
                self.long[cid].settled = True
            self.summary.results_checked += 1 if cid not in rec.counted else 0
            code = rs[0].get("errorCode")
            if cid not in rec.counted:
                rec.counted.add(cid)
                if code == OUTCOME_UNKNOWN:
                    self.summary.outcome_unknown += 1
                    if not rs[0].get("content", "").startswith("it may or may not have run"):
                        self.violation(f"{sid}: {cid} OUTCOME_UNKNOWN text: {rs[0]['content'][:80]}")
                elif code == NOT_STARTED:
                    self.summary.not_started += 1
        rec.durable = events
        rec.dirty = bool(rec.pending)  # a re-adopted call settles later: look again
        # Idempotency: re-send tool.run for calls that reached the log (must not run again) and
        # for calls that never became durable (safe to retry: they run now, once).
        unknown = [cid for cid in calls if results.get(cid, [{}])[0].get("errorCode") == OUTCOME_UNKNOWN
                   and cid in rec.sent]
        done = [cid for cid in calls if cid not in unknown and cid in rec.sent and results.get(cid)]
        again = unknown[-3:] + self.rng.sample(done, min(1, len(done)))
        for cid in again:
            before = self.marker_lines(cid)
            answer = await c.call("tool.run", {
                "sessionId": sid, "name": "bash", "arguments": {"command": rec.sent[cid]},
                "callId": cid, "approved": True})
            if answer.get("callId") != cid or not answer.get("existing"):
                self.violation(f"{sid}: re-sent {cid} was not recognised as existing: {answer}")
            result = await c.wait(sid, cid)
            if result != results[cid][0]:
                self.violation(f"{sid}: tool.wait after re-send of {cid} differs from the log")
            if self.marker_lines(cid) != before:
                self.violation(f"{sid}: re-sent {cid} ran again (marker changed)")
            self.summary.retried_existing += 1
        never = [cid for cid in rec.sent if cid not in calls and cid not in rec.acked]
        for cid in never[-3:]:
            if self.marker_lines(cid) is not None:
                continue  # already reported above
            rec.dirty = True
            answer = await c.call("tool.run", {
                "sessionId": sid, "name": "bash", "arguments": {"command": rec.sent[cid]},
                "callId": cid, "approved": True})
            if answer.get("callId") != cid or answer.get("existing"):
                self.violation(f"{sid}: retry of never-durable {cid} answered {answer}")
            result = await c.wait(sid, cid)
            rec.acked[cid] = result
            self.summary.calls_acked += 1
            self.summary.retried_fresh += 1
        # Calls that never became durable and were not retried are forgotten: they never ran.
        for cid in never[:-3]:
            if self.marker_lines(cid) is None:
                del rec.sent[cid]

    async def workload(self, it: int) -> None:
        live = [r for r in self.sessions.values() if r.born > it - self.working_set]
        async with connect(self.daemon.socket, "crash-campaign") as c:
            sid = await c.create_session(str(self.work), title=f"crash {it}",
                                         env={"DSH_CRASH_TOKEN": self.token})
        rec = SessionRecord(sid, it)
        self.sessions[sid] = rec
        live.append(rec)
        async with trio.open_nursery() as nursery:
            for rec in live:
                rec.dirty = True
                nursery.start_soon(self.guard, self.stream, rec)
                for w in range(self.workers_per_session):
                    nursery.start_soon(self.guard, self.worker, rec, it, w)
            if it % 2 == 0 or self.long_running() < 2:
                nursery.start_soon(self.guard, self.long_worker, self.rng.choice(live), it)

    async def guard(self, fn, *args) -> None:
        try:
            await fn(*args)
        except CLIENT_GONE:
            pass
        except MirrorBroken as exc:
            if self.daemon.running:
                self.violation(f"stream mirror broke: {exc}")
        except RpcError as exc:
            if self.daemon.running:
                self.violation(f"unexpected RPC error while the daemon ran: {exc!r}")

    async def worker(self, rec: SessionRecord, it: int, w: int) -> None:
        async with connect(self.daemon.socket, "crash-campaign") as c:
            while True:
                if self.rng.random() < 0.05:
                    await c.call("session.setApprovalPolicy", {"sessionId": rec.sid, "policy": "ask"})
                    rec.policy_acks += 1
                cid, command = self.new_call(rec, it, w)
                rec.sent[cid] = command
                self.summary.calls_sent += 1
                await c.run_tool(rec.sid, command, call_id=cid, approved=True)
                result = await c.wait(rec.sid, cid)
                rec.acked[cid] = result
                self.summary.calls_acked += 1

    async def long_worker(self, rec: SessionRecord, it: int) -> None:
        """One long call: marker, 12–20 s of sleep, its output, a random exit code."""
        self._n += 1
        cid = f"L{it}n{self._n}{secrets.token_hex(2)}"
        call = LongCall(rec.sid, self.rng.randint(0, 9), self.rng.randint(12, 20))
        command = (f"printf '%s\\n' {cid} >> {self.markers}/{cid}; sleep {call.seconds}; "
                   f"echo out-{cid}; exit {call.code}; : {self.token}")
        async with connect(self.daemon.socket, "crash-campaign") as c:
            rec.sent[cid] = command
            self.summary.calls_sent += 1
            await c.run_tool(rec.sid, command, call_id=cid, approved=True)
            call.sent_at = time.time()
            self.long[cid] = call  # durable now: its tool/call is in the log
            self.summary.long_calls += 1
            result = await c.wait(rec.sid, cid)
            rec.acked[cid] = result
            call.settled = True
            self.summary.calls_acked += 1

    async def stream(self, rec: SessionRecord) -> None:
        async with connect(self.daemon.socket, "crash-campaign") as c:
            sub = await c.subscribe(rec.sid)
            async for _view in sub:
                self.summary.stream_batches += 1

    # -- the end ------------------------------------------------------------------------
    async def final_check(self) -> None:
        self.daemon.start()
        with trio.move_on_after(self.iteration_timeout) as scope:
            try:
                await self.verify(self.summary.iterations, final=True)
                await self.settle_pending()
                await self.verify(self.summary.iterations, final=True, settled=True)
            except (RpcError, *CLIENT_GONE) as exc:
                self.violation(f"final verification failed: {exc!r}")
        if scope.cancelled_caught:
            self.violation("final verification did not finish")
        rc = self.daemon.stop(signal.SIGTERM)
        if rc != 0:
            self.violation(f"graceful stop exited {rc}\n{self.daemon.log_tail(10)}")
        self.offline_check()
        self.long_figures()

    async def settle_pending(self) -> None:
        """Wait for every call still running after the last restart (long calls: <= 20 s)."""
        async with connect(self.daemon.socket, "crash-campaign") as c:
            for rec in self.sessions.values():
                for cid in sorted(rec.pending):
                    await c.wait(rec.sid, cid)
                rec.dirty = True

    def long_figures(self) -> None:
        """The long calls that ran >= long_age s at a kill: real exit code, once, not lost."""
        s = self.summary
        s.long_hit = len(self.long_hit)
        for cid in sorted(self.long_hit):
            call = self.long[cid]
            res = self.final_results.get(cid)
            lines = self.marker_lines(cid)
            if lines is not None and len(lines) > 1:
                s.long_twice += 1
                self.violation(f"long call {cid} ran {len(lines)} times")
            if res is None:
                s.long_lost += 1
                self.violation(f"long call {cid} has no tool/result at the end (lost)")
            elif res.get("errorCode") == OUTCOME_UNKNOWN:
                s.long_unknown += 1
            elif res.get("exitCode") == call.code and not res.get("errorCode"):
                s.long_real += 1
                if f"out-{cid}" not in res.get("content", ""):
                    self.violation(f"long call {cid} settled without its output")
            else:
                self.violation(f"long call {cid} settled {res.get('exitCode')} "
                               f"{res.get('errorCode')}, not its exit code {call.code}")
        if s.long_hit and s.long_real < self.long_real_share * s.long_hit:
            self.violation(f"only {s.long_real} of {s.long_hit} long calls settled with their "
                           f"real exit code (< {100 * self.long_real_share:.0f}%)")

    def offline_check(self) -> None:
        """After a graceful stop: every log reads clean; markers match logs globally."""
        sessions_dir = self.daemon.state_dir / "sessions"
        called: set[str] = set()
        for d in sorted(sessions_dir.iterdir()) if sessions_dir.is_dir() else []:
            try:
                read = read_log(d, d.name)
            except FileNotFoundError:
                self.summary.orphan_session_dirs += 1  # created, killed before its first write
                if d.name in self.sessions:
                    self.violation(f"{d.name}: acknowledged session has no log")
                continue
            except StorageError as exc:
                self.violation(f"{d.name}: offline read failed: {exc}")
                continue
            if read.torn:
                self.violation(f"{d.name}: torn after a graceful stop")
            ids = [e.data.get("callId") for e in read.events if e.type == "tool/call"]
            self.final_results.update({e.data.get("callId"): e.data for e in read.events
                                       if e.type == "tool/result"})
            results = [e.data.get("callId") for e in read.events if e.type == "tool/result"]
            called.update(ids)
            if len(ids) != len(set(ids)):
                self.violation(f"{d.name}: a callId has two tool/call events")
            if sorted(set(ids)) != sorted(set(results) - self.sessions.get(
                    d.name, SessionRecord(d.name, 0)).announced) or len(results) != len(set(results)):
                self.violation(f"{d.name}: tool/call and tool/result do not pair up")
        markers = sorted(self.markers.iterdir())
        self.summary.markers = len(markers)
        for m in markers:
            lines = m.read_text().splitlines()
            if lines not in ([m.name], []):
                self.violation(f"marker {m.name} has lines {lines[:3]}")
            if m.name not in called:
                self.violation(f"marker {m.name} without a durable tool/call")
        if marked_pids(self.token):
            self.violation("tool processes outlived the graceful stop")


async def run_campaign(
    iterations: int,
    *,
    root: Path | None = None,
    seed: int | None = None,
    max_seconds: float | None = None,
    keep: bool = False,
    log=print,
    **options,
) -> Summary:
    """Run a campaign in ``root`` (default: a fresh short /tmp dir, removed unless ``keep``
    or a violation was found) and return its `Summary`."""
    own_root = root is None
    root = Path(root or tempfile.mkdtemp(prefix="dshc-"))
    seed = seed if seed is not None else secrets.randbelow(2**32)
    campaign = Campaign(root, seed=seed, log=log, **options)
    log(f"crash campaign: seed={seed} root={root} token={campaign.token}")
    summary = await campaign.run(iterations, max_seconds)
    if own_root and not keep and not summary.violations:
        shutil.rmtree(root, ignore_errors=True)
    elif summary.violations:
        log(f"kept {root} for inspection (dshd log: {campaign.daemon.log_path})")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-seconds", type=float, default=1800.0,
                   help="stop starting new iterations after this long (default 1800)")
    p.add_argument("--max-kill-delay", type=float, default=1.0,
                   help="the kill lands uniformly in [0, this] s after dshd listens")
    p.add_argument("--root", type=Path, default=None)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    summary = trio.run(lambda: run_campaign(
        args.iterations, root=args.root, seed=args.seed, max_seconds=args.max_seconds,
        keep=args.keep, max_kill_delay=args.max_kill_delay, progress=25))
    print("\n".join(summary.lines()))
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())
