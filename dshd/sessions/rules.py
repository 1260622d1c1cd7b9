"""A session's approval rules: "allow commands like this one for the rest of the session"
(PROTOCOL.md §3.4, STORAGE.md §3).

Theory of operation: a rule is made by a person's ``allow-for-session`` decision and lives in
the session's log: ``approval/rule {ruleId, kind, command | words, by, at}`` (appended and
made durable *before* the decision it came with), taken back by ``approval/rule-revoked
{ruleId, by}``. Both are ignorable events: a dshd that does not know them skips them, and
then asks about every call again (fail closed). :class:`RuleBook` keeps two views of the
same events:

* ``logged`` -- every rule as the log has it, folded when its event is appended (and on open:
  the last snapshot's ``rules`` list, then the tail's events): what the next snapshot holds
  (``dshd.sessions.logview.snapshot_state``), so rules survive a snapshot and a restart;
* ``live`` -- the rules the gate applies: a new rule only once its event is durable, a
  revoked one at once (before its event is durable: taking a permission back never waits).

The gate asks :meth:`RuleBook.match` with the call's command and the session's sandbox mode
now; the first live rule that allows it wins (exact rules first, then prefix rules, oldest
first; the command is lexed once for all prefix rules: ``protocol.shellwords``). Rules apply
to ``bash`` calls only: the rule's text is a command line (a call with its own ``env`` is
never given to a rule: the desk asks it). A rule records the session's sandbox mode when it
was made (``sandbox``) and matches only while the session's mode is that one or stricter
(:data:`SANDBOX_ORDER`): a rule never outlives a loosening of the sandbox (a rule logged
without a mode is taken as made under ``read-only``; an unknown mode matches nothing). At most
:data:`MAX_RULES` live rules a session (``-32013`` ``RULE_LIMIT`` past it: revoke one first).
Pure bookkeeping: no I/O here; the desk (``dshd.sessions.approval``) appends the events.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from protocol.shellwords import matches, matches_words, rule_problem, simple_words

from .. import errors

__all__ = ["MAX_RULES", "Rule", "RuleBook", "SANDBOX_ORDER", "new_rule", "no_looser"]

#: Live rules a session holds, at most.
MAX_RULES = 256
#: Sandbox modes, strictest first (EXEC.md §3).
SANDBOX_ORDER = ("read-only", "workspace-write", "danger-full-access")


def no_looser(mode: str, than: str) -> bool:
    """Whether sandbox ``mode`` is ``than`` or stricter (an unknown one is neither)."""
    if mode not in SANDBOX_ORDER or than not in SANDBOX_ORDER:
        return False
    return SANDBOX_ORDER.index(mode) <= SANDBOX_ORDER.index(than)


@dataclass(frozen=True)
class Rule:
    rule_id: str
    kind: str  # exact | prefix
    command: str  # exact: the text; prefix: the words joined as a command line
    words: tuple[str, ...] | None  # prefix only
    by: Any
    at: int
    #: The session's sandbox mode when the rule was made (module doc).
    sandbox: str = "read-only"

    def event(self) -> dict:
        """The ``approval/rule`` data."""
        data: dict[str, Any] = {"ruleId": self.rule_id, "kind": self.kind}
        if self.words is None:
            data["command"] = self.command
        else:
            data["words"] = list(self.words)
        data.update(by=self.by, at=self.at, sandbox=self.sandbox)
        return data

    def shown(self) -> dict:
        """The rule as ``approval.rules`` lists it (``command`` for both kinds)."""
        out = {"ruleId": self.rule_id, "kind": self.kind, "command": self.command,
               "by": self.by, "at": self.at, "sandbox": self.sandbox}
        if self.words is not None:
            out["words"] = list(self.words)
        return out

    def allows(self, command: str) -> bool:
        return matches(self.kind, self.command if self.words is None else self.words, command)


def _join(words: tuple[str, ...]) -> str:
    import shlex
    return shlex.join(words)


def new_rule(kind: str, command: str, by: Any, at: int, sandbox: str) -> Rule:
    """A new rule from a decision (``-32602`` with ``data.field`` ``rule`` when it cannot be
    one: ``protocol.shellwords.rule_problem``)."""
    problem = rule_problem(kind, command)
    if problem is not None:
        raise errors.InvalidParams(problem, field="rule", code="BAD_RULE")
    rule_id = "r-" + secrets.token_hex(6)
    if kind == "exact":
        return Rule(rule_id, kind, command, None, by, at, sandbox)
    words = simple_words(command) or ()
    return Rule(rule_id, kind, _join(words), words, by, at, sandbox)


def _from_event(data: dict) -> Rule | None:
    """The rule of an ``approval/rule`` data (or a snapshot's entry); None when malformed."""
    rule_id, kind = data.get("ruleId"), data.get("kind")
    if not isinstance(rule_id, str) or kind not in ("exact", "prefix"):
        return None
    sandbox = data.get("sandbox", "read-only")  # none logged: the strictest (module doc)
    sandbox = sandbox if isinstance(sandbox, str) else ""
    by, at = data.get("by"), int(data.get("at") or 0)
    if kind == "exact":
        command = data.get("command")
        return Rule(rule_id, kind, command, None, by, at, sandbox) \
            if isinstance(command, str) and command else None
    words = data.get("words")
    if not isinstance(words, list) or not words or not all(isinstance(w, str) for w in words):
        return None
    return Rule(rule_id, kind, _join(tuple(words)), tuple(words), by, at, sandbox)


class RuleBook:
    """One session's rules (module doc)."""

    def __init__(self) -> None:
        self.logged: dict[str, Rule] = {}
        self.live: dict[str, Rule] = {}

    # ------------------------------------------------------------ folding the log
    def fold(self, type_: str, data: dict) -> None:
        """An ``approval/rule`` / ``approval/rule-revoked`` as appended (``logged`` only)."""
        if type_ == "approval/rule":
            rule = _from_event(data)
            if rule is not None:
                self.logged[rule.rule_id] = rule
        elif type_ == "approval/rule-revoked":
            self.logged.pop(str(data.get("ruleId")), None)

    def restore(self, rules: Any) -> None:
        """A snapshot's ``rules`` list (absent in an older snapshot: none)."""
        for data in rules if isinstance(rules, list) else ():
            if isinstance(data, dict):
                self.fold("approval/rule", data)

    def opened(self) -> None:
        """The log is folded (on open): every logged rule is durable, so live."""
        self.live = dict(self.logged)

    def snapshot(self) -> list[dict]:
        """The ``rules`` of the next snapshot: every logged rule's event data."""
        return [rule.event() for rule in self.logged.values()]

    # ------------------------------------------------------------ the live rules
    def check_room(self) -> None:
        if len(self.live) >= MAX_RULES or len(self.logged) >= MAX_RULES:
            raise errors.LimitExceeded(
                f"this session has {MAX_RULES} approval rules already (the most it keeps); "
                "revoke one first (`dsh policy SESSION --rules`, `--revoke RULE`)",
                {"code": "RULE_LIMIT"})

    def apply(self, rule: Rule) -> None:
        """``rule``'s event is durable: the gate uses it from now on."""
        self.live[rule.rule_id] = rule

    def revoke(self, rule_id: str) -> Rule | None:
        """Take ``rule_id`` out of the live rules at once; the rule, None when not live."""
        return self.live.pop(rule_id, None)

    def match(self, tool: str, command: str, *, mode: str) -> Rule | None:
        """The live rule that allows this call under sandbox ``mode`` (module doc), or None."""
        if tool != "bash":
            return None
        rules = [r for r in self.live.values() if no_looser(mode, r.sandbox)]
        exact = next((r for r in rules if r.kind == "exact" and r.command == command), None)
        if exact is not None or not any(r.kind == "prefix" for r in rules):
            return exact
        words = simple_words(command)  # once for every prefix rule (module doc)
        return next((r for r in rules if r.kind == "prefix" and matches_words(r.words, words)),
                    None)

    def listed(self) -> list[dict]:
        return [rule.shown() for rule in self.live.values()]
