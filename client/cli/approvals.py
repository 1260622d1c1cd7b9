"""Pending approvals and approval rules from a terminal or a script (PROTOCOL.md §3.4):
``dsh approvals``, ``dsh approve``, ``dsh policy``.

Theory of operation: each command is one short program over ``client.api``:
``dsh approvals`` lists ``approval.list`` (every pending request of the sessions you may
use, oldest first) as an aligned table, or JSON; ``dsh approve`` decides one request --
named by its approval id alone (the session is found in that list), or by SESSION and
APPROVAL as before, or by SESSION alone -- or nothing: the newest session of the current
directory -- when exactly one request waits there (it says which, and the command) -- as
``allow-once`` (the default), ``allow-for-session`` (a rule: the exact command, or with
``--prefix WORDS`` every simple command that starts with those words) or ``reject``;
``dsh policy`` sets the policy (ask | never), lists the live rules (``--rules``) or
revokes one (``--revoke RULE``). Sessions are named as everywhere (``client.cli.sessionref``).
The decision's outcome goes to stdout; what a rule now allows and how to take it back, to
stderr. Exit 0, or 1 when the request was decided already or is not pending, or nothing is
pending (``client.exits``); 2 (a usage error) when several wait and none is named.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from client.cli.common import Options, execute, json_flag, pass_options
from client.cli.sessionref import SESSION_REF, resolve_session
from client.cli.terminal import cell, emit, fmt_time, note, print_json
from client.exits import decided_status
from protocol.printable import printable
from protocol.rpc import ALREADY_DECIDED, RpcError

__all__ = ["approvals", "approve", "policy"]

POLICIES = ("ask", "never")
#: What an approval id looks like ("a-" + 12 hex), to tell it from a session reference.
APPROVAL_ID = re.compile(r"a-[0-9a-f]{12}")
#: Widest command cell of the ``dsh approvals`` table (``--json`` has the whole command).
COMMAND_WIDTH = 60


def _table(rows: list[list[str]]) -> str:
    """Rows as aligned plain text (the first row is the header); the last column unpadded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "".join("  ".join([c.ljust(w) for c, w in zip(row, widths)] + [row[-1]]).rstrip()
                   + "\n" for row in rows)


@click.command()
@json_flag
@pass_options
def approvals(opts: Options, as_json: bool) -> None:
    """List the approval requests waiting for a decision, in every session you may use.

    Answer one with `dsh approve APPROVAL` (--reject, --allow-for-session).
    """

    async def body(client: Any) -> int:
        pending = await client.approvals()
        if as_json or opts.json:
            print_json({"approvals": pending})
            return 0
        if not pending:
            note("no approval is pending")
            return 0
        rows = [["SESSION", "APPROVAL", "COMMAND", "ASKED"]]
        rows += [[cell(p.session_name or p.session_id), p.approval_id,
                  cell(p.summary if p.tool == "bash" else f"{p.tool}: {p.summary}",
                       COMMAND_WIDTH), fmt_time(p.asked_at)] for p in pending]
        emit(_table(rows))
        return 0

    sys.exit(execute(opts, body))


async def _find(client: Any, first: str | None, second: str | None) -> tuple[str, str]:
    """(session id, approval id) of ``dsh approve``'s arguments (module doc)."""
    if second is not None:
        return await resolve_session(client, first), second
    pending = await client.approvals()
    if first is not None:
        for p in pending:
            if p.approval_id == first:
                return p.session_id, first
        if APPROVAL_ID.fullmatch(first):
            raise click.ClickException(
                f"approval {first} is not pending in any session you may use (decided "
                "already, or unknown); `dsh approvals` lists what waits")
    session_id = await resolve_session(client, first)
    here = [p for p in pending if p.session_id == session_id]
    if len(here) == 1:
        note(f"dsh: approval {here[0].approval_id}: {printable(here[0].summary)}")
        return session_id, here[0].approval_id
    if not here:
        what = (f"no approval {first} is pending in a session you may use, and "
                if first is not None else "")
        raise click.ClickException(f"{what}no approval is pending in session {session_id} "
                               "(`dsh approvals` lists what waits)")
    raise click.UsageError(f"{len(here)} approvals are pending in session {session_id}: name "
                           "one (`dsh approvals` lists them)")


@click.command()
@click.argument("first", required=False, metavar="[SESSION]", type=SESSION_REF)
@click.argument("second", required=False, metavar="[APPROVAL]")
@click.option("--allow-once", "decision", flag_value="allow-once", default=True,
              help="Allow this call once (the default).")
@click.option("--allow-for-session", "decision", flag_value="allow-for-session",
              help="Allow it, and from now on every call of this session with the same "
                   "command (or, with --prefix, every simple command starting with WORDS).")
@click.option("--reject", "decision", flag_value="reject", help="Reject the call.")
@click.option("--prefix", metavar="WORDS",
              help="With --allow-for-session: the leading words a command must start with "
                   "(e.g. 'git status'); a command with ;, &&, ||, |, &, $, backticks, "
                   "redirections or newlines never matches a prefix.")
@json_flag
@pass_options
def approve(opts: Options, first: str | None, second: str | None, decision: str,
            prefix: str | None, as_json: bool) -> None:
    """Decide a pending approval request; print the outcome.

    `dsh approve APPROVAL` (its session is found), `dsh approve SESSION APPROVAL`, or
    `dsh approve [SESSION]` when one request waits there (no SESSION: the newest session of
    this directory). Exit 1 when it was already decided ("already decided: OUTCOME"), is
    unknown, or nothing is pending; 2 when several are pending and none is named.
    """
    if prefix is not None and decision != "allow-for-session":
        raise click.UsageError("--prefix goes with --allow-for-session")

    async def body(client: Any) -> int:
        session_id, approval_id = await _find(client, first, second)
        rule = ("prefix", prefix) if prefix is not None else None
        try:
            result = await client.decide_full(session_id, approval_id, decision, rule)
        except RpcError as exc:
            if exc.code != ALREADY_DECIDED:
                raise
            done = exc.data.get("outcome") if isinstance(exc.data, dict) else None
            if as_json or opts.json:
                print_json({"outcome": done, "alreadyDecided": True})
            note(f"dsh: approval {approval_id} already decided: {done}")
            return decided_status(already=True)
        if as_json or opts.json:
            print_json(result)
        elif isinstance(result.rule_id, str):
            kind = f"prefix {printable(prefix)}" if prefix else "exact command"
            emit(f"allowed for the session by rule {result.rule_id} ({kind})\n")
        else:
            emit(f"{printable(str(result.outcome))}\n")
        if isinstance(result.rule_id, str):
            what = f"commands starting with {prefix!r}" if prefix else "this exact command"
            note(f"dsh: rule {result.rule_id} allows {what} in session {session_id} without "
                 f"asking; take it back with `dsh policy {session_id} --revoke {result.rule_id}`")
        return decided_status(already=False)

    sys.exit(execute(opts, body))


def _policy_choice(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None or value in POLICIES:
        return value
    raise click.BadParameter(
        f"{value!r} is not an approval policy: choose ask (a person decides each call) or "
        "never (every call is rejected). To let commands run without asking, answer one with "
        "`dsh approve APPROVAL --allow-for-session [--prefix WORDS]`: it adds a rule "
        "(`dsh policy SESSION --rules` lists them, `--revoke RULE` takes one back).")


@click.command()
@click.argument("session_ref", metavar="SESSION", type=SESSION_REF)
@click.argument("policy", required=False, metavar="[ask|never]", callback=_policy_choice)
@click.option("--rules", "show_rules", is_flag=True, help="List the session's approval rules.")
@click.option("--revoke", metavar="RULE", help="Take an approval rule back.")
@json_flag
@pass_options
def policy(opts: Options, session_ref: str, policy: str | None, show_rules: bool,
           revoke: str | None, as_json: bool) -> None:
    """Set the approval policy of SESSION: ask (wait for an answerer) or never (reject);
    or list its approval rules (--rules), or revoke one (--revoke RULE)."""
    if sum((policy is not None, show_rules, revoke is not None)) != 1:
        raise click.UsageError("give one of: a policy (ask|never), --rules, --revoke RULE")
    json_out = as_json or opts.json

    async def body(client: Any) -> int:
        session_id = await resolve_session(client, session_ref)
        if show_rules:
            return _print_rules(session_id, await client.rules(session_id), json_out)
        if revoke is not None:
            await client.revoke_rule(session_id, revoke)
            if json_out:
                print_json({"sessionId": session_id, "revoked": revoke})
            else:
                note(f"session {session_id}: rule {revoke} revoked; such calls are asked again")
            return 0
        await client.set_policy(session_id, policy)
        if json_out:
            print_json({"sessionId": session_id, "approvalPolicy": policy})
        else:
            note(f"session {session_id}: approval policy {policy}")
        return 0

    sys.exit(execute(opts, body))


def _print_rules(session_id: str, rules: list, json_out: bool) -> int:
    if json_out:
        print_json({"sessionId": session_id, "rules": rules})
        return 0
    if not rules:
        note(f"session {session_id} has no approval rules")
        return 0
    rows = [["RULE", "KIND", "COMMAND", "BY", "MADE"]]
    rows += [[r.rule_id, r.kind, cell(r.command, COMMAND_WIDTH), cell(r.by), fmt_time(r.at)]
             for r in rules]
    emit(_table(rows))
    return 0

