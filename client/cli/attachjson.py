"""``dsh attach --json``: the results of a session's calls as JSON lines, no output.

Theory of operation: the calls attached are the one ``--call`` names, else those in the
session's lane when it is first seen (with ``--follow``: and every call that enters it
later). Each is waited for with ``tool.wait`` (across a daemon restart: ``client.link.ride``)
and printed, as it settles, as one line ``{"sessionId", "callId", "result"}`` (``result``:
the ToolResult as ``dsh wait --json`` and ``dsh run --json`` print it). The exit status is the
call's (``client.exits``) when one call was attached, else 0 when every result was a success
and 1 otherwise; no call at all is 0 with a line on stderr, as without ``--json``.
"""

from __future__ import annotations

import anyio
import msgspec

from client.cli.callstate import Call
from client.cli.output import tools_of
from client.cli.stream import wait_result
from client.cli.terminal import note, print_json
from client.exits import EXIT_ERROR, EXIT_OK, exit_status
from client.link import Link, ride

__all__ = ["attach_json"]


async def attach_json(link: Link, session_id: str, call_id: str | None, follow: bool) -> int:
    statuses: list[int] = []

    async def one(cid: str) -> None:
        result = await ride(link, lambda c: wait_result(c, Call(session_id, cid)), note)
        print_json({"sessionId": session_id, "callId": cid,
                    "result": msgspec.to_builtins(result)})
        statuses.append(exit_status(result)[0])

    if call_id is not None:
        await one(call_id)
        return statuses[0]
    seen: set[str] = set()
    async with anyio.create_task_group() as tasks:
        async with await link.client.subscribe(session_id) as sub:
            async for view in sub:
                for cid in tools_of(view):
                    if cid not in seen:
                        seen.add(cid)
                        tasks.start_soon(one, cid)
                if not follow:
                    break
    if not seen:
        note(f"no call is running in session {session_id}", "dim")
        return EXIT_OK
    if len(statuses) == 1:
        return statuses[0]
    return EXIT_OK if all(s == EXIT_OK for s in statuses) else EXIT_ERROR
