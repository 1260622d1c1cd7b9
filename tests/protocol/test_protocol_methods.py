"""The methods' params AND result structs (PROTOCOL.md §2–§3) and the one method table."""

from __future__ import annotations

import json

import msgspec
import pytest

from protocol import methods as m
from protocol import rpc
from protocol.lane import ToolResult
from protocol.rpc import RpcError, decode_params, encode_request, encode_response, parse_message


def one(line):
    msgs = parse_message(line)
    assert len(msgs) == 1 and not msgs.is_batch
    return msgs[0]


def test_encode_struct_params():
    params = m.SessionEventsParams(session_id="s", after_seq=4)
    req = one(encode_request(1, "session.events", params))
    assert decode_params(req.params, m.SessionEventsParams) == params
    assert json.loads(bytes(req.params)) == {"sessionId": "s", "afterSeq": 4, "limit": 1000}


def test_params_defaults_and_snake_case_names():
    p = decode_params(b'{"sessionId":"s"}', m.SessionEventsParams)
    assert (p.session_id, p.after_seq, p.limit) == ("s", -1, 1000)
    assert not hasattr(p, "sessionId") and not hasattr(p, "afterSeq")  # no alias patching
    assert decode_params(b'{"sessionId":"s","limit":10000}', m.SessionEventsParams).limit == 10000
    t = decode_params(b'{"sessionId":"s","name":"bash","arguments":{"command":"ls"},"future":1}', m.ToolRunParams)
    assert (t.call_id, t.approved, t.arguments) == (None, False, {"command": "ls"})
    i = decode_params(b'{"protocolVersion":1}', m.InitializeParams)
    assert i.protocol_version == 1 and i.capabilities is None and i.client is None
    i = decode_params(b'{"protocolVersion":1,"client":{"name":"dsh","version":"0.1"},"capabilities":{"approvals":true}}',
                      m.InitializeParams)
    assert i.capabilities == m.ClientCapabilities(approvals=True)
    assert msgspec.to_builtins(i.client) == {"name": "dsh", "version": "0.1"}
    assert decode_params(msgspec.Raw(), m.EmptyParams) == m.EmptyParams()
    assert decode_params(b'{"extra":1}', m.EmptyParams) == m.EmptyParams()
    assert decode_params(b"null", m.EmptyParams) == m.EmptyParams()
    assert decode_params('{"sessionId":"s","policy":"never"}', m.SetApprovalPolicyParams).policy == "never"
    w = decode_params(b'{"sessionId":"s","callId":"c","timeout":1}', m.ToolWaitParams)
    assert w.timeout == 1.0
    b = decode_params(b'{"command":"ls","timeout":2.5}', m.BashArguments)
    assert (b.command, b.timeout) == ("ls", 2.5)
    c = decode_params(b'{"cwd":"/w","approvalPolicy":"never","sandbox":"read-only","env":{"A":"1"}}',
                      m.SessionCreateParams)
    assert (c.approval_policy, c.sandbox, c.env) == ("never", "read-only", {"A": "1"})


@pytest.mark.parametrize(
    "raw, type_, field",
    [
        (b'{"sessionId":"s","limit":10001}', m.SessionEventsParams, "limit"),
        (b'{"sessionId":"s","limit":-1}', m.SessionEventsParams, "limit"),
        (b'{"sessionId":"s","afterSeq":-2}', m.SessionEventsParams, "afterSeq"),
        (b'{"sessionId":"s","limit":"10"}', m.SessionEventsParams, "limit"),
        (b'{"limit":10}', m.SessionEventsParams, "sessionId"),
        (b"{}", m.SessionGetParams, "sessionId"),
        (b"[]", m.SessionGetParams, "object"),
        (b'{"sessionId":"s","name":"bash","arguments":{},"callId":"has space"}', m.ToolRunParams, "callId"),
        (b'{"sessionId":"s","name":"bash","arguments":{},"callId":""}', m.ToolRunParams, "callId"),
        (b'{"sessionId":"s","name":"bash","arguments":{},"callId":"' + b"x" * 65 + b'"}', m.ToolRunParams, "callId"),
        (b'{"sessionId":"s","name":"bash","arguments":{},"callId":"__proto__"}', m.ToolRunParams, "callId"),
        (b'{"sessionId":"s","name":"bash","arguments":{},"callId":"constructor"}', m.ToolRunParams, "callId"),
        (b'{"sessionId":"s","name":"bash","arguments":[]}', m.ToolRunParams, "arguments"),
        (b'{"sessionId":"s","name":"bash"}', m.ToolRunParams, "arguments"),
        (b'{"sessionId":"s","name":"bash","arguments":{},"approved":"yes"}', m.ToolRunParams, "approved"),
        (b'{"sessionId":"s","callId":"c","timeout":-1}', m.ToolWaitParams, "timeout"),
        (b'{"sessionId":"s","policy":"sometimes"}', m.SetApprovalPolicyParams, "policy"),
        (b'{"cwd":"relative/dir"}', m.SessionCreateParams, "cwd"),
        (b'{"cwd":"/w","sandbox":"none"}', m.SessionCreateParams, "sandbox"),
        (b'{"cwd":"/w","env":{"A":1}}', m.SessionCreateParams, "env"),
        (b'{"protocolVersion":"1"}', m.InitializeParams, "protocolVersion"),
        (b'{"protocolVersion":1,"capabilities":{"approvals":"yes"}}', m.InitializeParams, "approvals"),
        (b'{"protocolVersion":1,"client":{"name":7}}', m.InitializeParams, "name"),
        (b'{"sessionId":"s","approvalId":"a","decision":"maybe"}', m.ApprovalDecideParams, "decision"),
        (b'{"subscriptionId":"q","seq":-1,"ops":[]}', m.StreamParams, "seq"),
        (b'{"sessionId":', m.SessionGetParams, "malformed"),
        (b'{"olderThan":-1}', m.SessionPruneParams, "olderThan"),
        (b'{"olderThan":"7d"}', m.SessionPruneParams, "olderThan"),
        (b'{"sessionId":"s","force":"yes"}', m.SessionDeleteParams, "force"),
    ],
)
def test_bad_params_name_the_field(raw, type_, field):
    with pytest.raises(RpcError) as info:
        decode_params(raw, type_)
    assert info.value.code == rpc.INVALID_PARAMS
    assert field in info.value.message


def test_method_params_cover_the_protocol():
    methods = {
        "initialize", "session.create", "session.list", "session.get", "session.events",
        "session.setApprovalPolicy", "tool.run", "tool.wait", "tool.cancel", "subscribe",
        "unsubscribe", "approval.decide", "turn.start", "turn.cancel", "turn.steer", "daemon.status",
        "tool.read", "tool.follow", "tool.unfollow", "tool.write", "tool.closeStdin",
        "tool.resize", "tool.signal", "session.find", "session.rename",
        "session.delete", "session.prune",  # issue 15, room cleanup
        "approval.rules", "approval.revokeRule", "approval.list", "session.setSandbox",
    }
    assert methods == set(m.METHODS)
    for params, _result in m.METHODS.values():
        assert issubclass(params, msgspec.Struct)
    assert set(m.NOTIFICATIONS) == {"stream", "output"}


@pytest.mark.parametrize("raw, field", [
    (b'{"sessionId": "s1", "limit": 10001}', "limit"),
    (b'{"sessionId": 5}', "sessionId"),
    (b'{"sessionId": "s1", "name": "bash", "arguments": {}, "callId": 7}', "callId"),
])
def test_invalid_params_name_the_field_in_data(raw, field):
    """A client finds the bad field in ``data.field`` without parsing the message (a client
    written from docs/ alone could not)."""
    type_ = m.SessionEventsParams if b"limit" in raw or raw == b'{"sessionId": 5}' \
        else m.ToolRunParams
    with pytest.raises(rpc.RpcError) as info:
        decode_params(raw, type_)
    assert info.value.code == rpc.INVALID_PARAMS
    assert "detail" in info.value.data
    assert info.value.data["field"] == field


def test_every_struct_field_is_snake_case_and_reads_camel_on_the_wire():
    """One naming rule: snake_case attributes, the PROTOCOL.md names (camelCase) encoded."""
    structs = {t for pair in m.METHODS.values() for t in pair if isinstance(t, type)}
    structs |= set(m.NOTIFICATIONS.values()) | {m.SessionInfo, m.ServerInfo, m.SandboxInfo}
    for struct in structs:
        if not issubclass(struct, msgspec.Struct):
            continue
        for name, wire in zip(struct.__struct_fields__, struct.__struct_encode_fields__):
            assert name == name.lower(), f"{struct.__name__}.{name} is not snake_case"
            head, *rest = name.split("_")
            assert wire == head + "".join(w.capitalize() for w in rest), (struct, name, wire)


def _result_bytes(result) -> bytes:
    return encode_response(1, result)


@pytest.mark.parametrize("struct, old", [
    # The dicts the handlers sent before the result structs: the bytes must not change.
    (m.SessionCreateResult(session_id="s1"), {"sessionId": "s1"}),
    (m.ToolRunResult(call_id="c1"), {"callId": "c1"}),
    (m.ToolRunResult(call_id="c1", existing=True), {"callId": "c1", "existing": True}),
    (m.CancelledResult(cancelled=False), {"cancelled": False}),
    (m.SubscribeResult(subscription_id="q1"), {"subscriptionId": "q1"}),
    (m.ApprovalDecideResult(outcome="allowed-once"), {"outcome": "allowed-once"}),
    (m.TurnStartResult(turn_id="t1"), {"turnId": "t1"}),
    (m.TurnSteerResult(turn_id="t1"), {"turnId": "t1", "queued": True}),
    (m.EmptyResult(), {}),
    (m.SessionEventsResult(events=[], last_seq=-1), {"events": [], "lastSeq": -1}),
])
def test_result_structs_encode_as_the_dicts_did(struct, old):
    assert _result_bytes(struct) == _result_bytes(old)


INFO = {"sessionId": "s1", "title": None, "cwd": "/w", "createdAt": 5, "approvalPolicy": "ask",
        "sandbox": "workspace-write", "running": 0, "lastSeq": 3, "owner": None}


def test_session_info_keeps_its_key_order_nulls_and_absent_keys():
    info = msgspec.convert(INFO, m.SessionInfo)
    assert _result_bytes(info) == _result_bytes(INFO)
    damaged = {"sessionId": "s2", "damaged": "log is damaged at byte 7"}
    assert _result_bytes(msgspec.convert(damaged, m.SessionInfo)) == _result_bytes(damaged)
    listed = m.SessionListResult(sessions=[info])
    assert _result_bytes(listed) == _result_bytes({"sessions": [INFO]})


def test_a_client_decodes_every_result_with_the_table():
    """The client half: the bytes the daemon sends decode into the method's result struct."""
    for method, old in [("session.create", {"sessionId": "s1"}), ("session.get", INFO),
                        ("tool.run", {"callId": "c", "existing": True}),
                        ("turn.steer", {"turnId": "t", "queued": True})]:
        result = m.METHODS[method].result
        resp = one(_result_bytes(old))
        decoded = msgspec.json.decode(resp.result, type=result)
        assert msgspec.to_builtins(decoded) == old


def test_bash_arguments_one_rule():
    """PROTOCOL.md §3.2: command a non-empty str without NUL (blank is a command), timeout
    > 0 and <= 604800, other keys ignored."""
    ok = [{"command": " "}, {"command": "ls", "timeout": 604800}, {"command": "ls", "x": 1},
          {"command": "ls", "timeout": 0.5}]
    for arguments in ok:
        msgspec.convert(arguments, m.BashArguments)
    bad = [{}, {"command": ""}, {"command": 5}, {"command": "a\0b"},
           {"command": "ls", "timeout": 0}, {"command": "ls", "timeout": 604801},
           {"command": "ls", "timeout": True}, {"command": "ls", "timeout": "5"}]
    for arguments in bad:
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(arguments, m.BashArguments)


def _repair_results() -> list[dict]:
    """The ToolResults a crash repair records (``dshd.storage.repair``): no truncation for a
    call that never started, the checkpointed window's for one whose outcome is unknown."""
    from dshd.storage.format import Event
    from dshd.storage.repair import repair_closers

    events = [Event(0, 0, "tool/call", {"callId": "c1", "name": "bash", "arguments": "{}"}),
              Event(1, 0, "tool/call", {"callId": "c2", "name": "bash", "arguments": "{}"}),
              Event(2, 0, "approval/asked", {"approvalId": "a", "callId": "c2", "tool": "bash",
                                             "summary": "x"})]
    window = {"content": [{"type": "text", "text": "partial\n"}],
              "truncation": {"truncated": True, "truncatedBy": "bytes", "totalBytes": 99,
                             "totalLines": 3, "maxBytes": 16, "maxLines": 2000},
              "details": {"spillPath": "/state/calls/c1.log"}}
    return [data for type_, data in repair_closers(events, {"c1": window})
            if type_ == "tool/result"]


SESSION_RESULT = {
    "callId": "c9", "isError": True, "content": "out\n",
    "details": {"truncation": {"truncated": False, "truncatedBy": None, "totalBytes": 4,
                               "totalLines": 1, "maxBytes": 51200, "maxLines": 2000},
                "spillPath": "/state/calls/c9.log", "exitCode": 143,
                "sandbox": {"provider": "landlock", "completeness": "partial"}},
    "exitCode": 143, "errorCode": "TOOL_CANCELLED", "message": "cancelled",
}


def test_tool_wait_answers_every_recorded_result_as_the_same_bytes():
    """tool.wait's result is ``protocol.lane.ToolResult`` on both sides: the daemon converts
    what the session recorded (a session-built result, a crash repair's) and the bytes it
    sends are the bytes the recorded dict encoded to; the client decodes them back."""
    assert m.METHODS["tool.wait"].result is ToolResult
    recorded = [SESSION_RESULT, *_repair_results()]
    assert {r.get("errorCode") for r in recorded} == {
        "TOOL_CANCELLED", "TOOL_OUTCOME_UNKNOWN", "TOOL_NOT_STARTED"}
    # A repair's result has zero totals when no window was checkpointed (PROTOCOL.md §3.2).
    assert any(r["details"]["truncation"]["totalBytes"] == 0 and r["errorCode"] ==
               "TOOL_NOT_STARTED" for r in recorded)
    for old in recorded:
        answer = msgspec.convert(old, m.METHODS["tool.wait"].result)
        assert _result_bytes(answer) == _result_bytes(old)
        decoded = msgspec.json.decode(one(_result_bytes(old)).result, type=ToolResult)
        assert decoded == answer and decoded == old  # a struct also equals its JSON value
        assert decoded["details"] == old["details"]  # and reads by wire name


@pytest.mark.parametrize("method", ["session.get", "tool.run", "subscribe", "tool.wait"])
def test_a_missing_required_field_is_named_in_data_field(method):
    """PROTOCOL.md §3: ``data.field`` names the field whenever one is named (a missing one
    too, not only a wrong one)."""
    with pytest.raises(rpc.RpcError) as caught:
        rpc.decode_params(b"{}", m.METHODS[method].params)
    assert caught.value.code == rpc.INVALID_PARAMS
    assert caught.value.data["field"] == "sessionId"
