"""``dsh rm`` and ``dsh prune``: deleting sessions (PROTOCOL.md §3.1 ``session.delete``,
``session.prune``).

Theory of operation: ``dsh rm SESSION...`` resolves each reference (``sessionref``) and asks
``session.delete`` for each in order; one that fails (busy without ``--force``, not found,
another user's) is one stderr line and the others still go; the status is 1 when any failed.
``dsh prune --older-than DURATION`` is one ``session.prune`` (repeated while the daemon says
``more``): it lists what was (or, with ``--dry-run``, would be) deleted and what was skipped
and why. A duration is a whole number and one unit of ``s m h d w`` (``30s``, ``15m``,
``12h``, ``7d``, ``2w``): a small strict parser (no library: anything else is a usage error,
never a guess).
"""

from __future__ import annotations

import re
import sys

import click

from client.api import Client
from client.cli.common import Options, execute, json_flag, pass_options
from client.cli.sessionref import SESSION_REF, resolve_session
from client.cli.terminal import emit, note, print_json
from protocol.rpc import RpcError

__all__ = ["parse_duration", "prune", "rm"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_DURATION = re.compile(r"([0-9]{1,9})([smhdw])")
#: ``session.prune`` rounds one ``dsh prune`` asks for at most (each deletes ≤ 1,000).
PRUNE_ROUNDS = 100


def parse_duration(text: str) -> int:
    """Seconds of ``30s`` / ``15m`` / ``12h`` / ``7d`` / ``2w`` (ValueError otherwise)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration: use a whole number and one unit of "
                         "s, m, h, d, w (30s, 15m, 12h, 7d, 2w)")
    return int(match.group(1)) * _UNITS[match.group(2)]


class Duration(click.ParamType):
    name = "duration"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        if isinstance(value, int):
            return value
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


@click.command()
@click.argument("refs", metavar="SESSION...", nargs=-1, required=True, type=SESSION_REF)
@click.option("--force", is_flag=True,
              help="Cancel the session's running calls, approvals and turn first.")
@json_flag
@pass_options
def rm(opts: Options, refs: tuple[str, ...], force: bool, as_json: bool) -> None:
    """Delete sessions (their log and every call's output). A session with running calls,
    pending approvals or a running turn is refused unless --force cancels them."""

    async def body(client: Client) -> int:
        failed = 0
        for ref in refs:
            try:
                sid = await resolve_session(client, ref)
                done = await client.call("session.delete", {"sessionId": sid, "force": force})
            except RpcError as exc:
                note(f"dsh: {_rm_failure(exc, ref)}")
                failed += 1
                continue
            if as_json or opts.json:
                print_json({"sessionId": sid, **done})
            else:
                cancelled = done.get("cancelled", 0)
                note(f"deleted session {sid}"
                     + (f" (cancelled {cancelled})" if cancelled else ""))
        return 1 if failed else 0

    sys.exit(execute(opts, body))


def _rm_failure(exc: RpcError, ref: str) -> str:
    """The sentence of a failed delete, in the CLI's words (SESSION_BUSY names ``--force``)."""
    data = exc.data if isinstance(exc.data, dict) else {}
    if data.get("code") != "SESSION_BUSY":
        return exc.message
    return (f"session {ref} is busy ({data.get('running', '?')} running call(s), approval(s) "
            f"or turn); nothing was deleted. Wait for it to finish, or run "
            f"`dsh rm --force {ref}`, which cancels them first")


@click.command()
@click.option("--older-than", "older_than", required=True, type=Duration(), metavar="DURATION",
              help="Delete idle sessions not updated for this long (30s, 15m, 12h, 7d, 2w).")
@click.option("--dry-run", is_flag=True, help="Delete nothing; list what would be deleted.")
@json_flag
@pass_options
def prune(opts: Options, older_than: int, dry_run: bool, as_json: bool) -> None:
    """Delete your idle sessions not updated for --older-than (busy and damaged ones are
    skipped, and said so)."""

    async def body(client: Client) -> int:
        deleted: list[str] = []
        skipped: list[dict] = []
        freed = 0
        for _ in range(1 if dry_run else PRUNE_ROUNDS):
            done = await client.call("session.prune",
                                     {"olderThan": older_than, "dryRun": dry_run})
            deleted += done["deleted"]
            skipped += done["skipped"]
            freed += done["freedBytes"]
            if not done.get("more") or not done["deleted"]:
                break
        if as_json or opts.json:
            print_json({"deleted": deleted, "skipped": skipped, "freedBytes": freed,
                        "dryRun": dry_run})
            return 0
        verb = "would delete" if dry_run else "deleted"
        emit("".join(f"{verb} {sid}\n" for sid in deleted))
        emit("".join(f"skipped {s['sessionId']}: {s['reason']}\n" for s in skipped))
        note(f"{verb} {len(deleted)} session(s), {_size(freed)}"
             + (f"; skipped {len(skipped)}" if skipped else ""))
        return 0

    sys.exit(execute(opts, body))
