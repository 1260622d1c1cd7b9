"""``protocol.printable.printable``: nothing that came over the wire reaches a terminal raw."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from protocol.printable import printable
from client.spill import command_ran as _command_ran
from protocol.lane import ToolResult


def command_ran(wire: dict) -> bool:
    """``command_ran`` of a ToolResult given as the wire's JSON (decoded as the client does)."""
    return _command_ran(msgspec.convert(wire, ToolResult))


def test_escapes_are_made_visible():
    assert printable("a\x1b[2Kb") == "a\\x1b[2Kb"
    assert printable("\x9b1m\x07\r\x7f") == "\\x9b1m\\x07\\x0d\\x7f"
    assert printable("rm -rf ~ \u202e") == "rm -rf ~ \\u202e"  # a bidi override
    assert printable("tab\tnl\n") == "tab\\tnl\\n"
    assert printable("tab\tnl\n", keep="\n\t") == "tab\tnl\n"
    assert printable("plain ünïcode ✓") == "plain ünïcode ✓"


@given(st.text())
def test_no_control_character_survives(text):
    shown = printable(text, keep="\n")
    assert all(ch.isprintable() or ch == "\n" for ch in shown)


def test_a_result_that_never_ran_is_told_apart_by_more_than_its_truncation():
    zeros = {"truncated": False, "truncatedBy": None, "totalBytes": 0, "totalLines": 0,
             "maxBytes": 51200, "maxLines": 2000}
    never = {"callId": "c", "isError": True, "content": "nobody was attached…",
             "details": {"truncation": zeros}, "errorCode": "APPROVAL_UNAVAILABLE"}
    assert not command_ran(never)
    assert command_ran({**never, "exitCode": 0})
    assert command_ran({**never, "message": "cancelled; the process group was killed"})
    assert command_ran({**never, "details": {"truncation": {**zeros, "totalBytes": 3}}})
