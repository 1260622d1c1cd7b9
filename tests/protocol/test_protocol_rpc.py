"""JSON-RPC 2.0 messages (PROTOCOL.md §1–§4): parse, encode, decode_params (the envelope).

The methods' params and result structs are tests/protocol/test_protocol_methods.py's."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import methods as m
from protocol import rpc
from protocol.rpc import (
    ErrorResponse,
    Messages,
    Notification,
    Request,
    Response,
    RpcError,
    decode_params,
    encode_batch,
    encode_error,
    encode_notification,
    encode_request,
    encode_response,
    parse_message,
)

CODES = {
    "PARSE_ERROR": -32700, "INVALID_REQUEST": -32600, "METHOD_NOT_FOUND": -32601,
    "INVALID_PARAMS": -32602, "INTERNAL_ERROR": -32603, "PERMISSION_DENIED": -32001,
    "NOT_INITIALIZED": -32002, "UNSUPPORTED_VERSION": -32003, "SESSION_NOT_FOUND": -32004,
    "SESSION_LOCKED": -32005, "CALL_NOT_FOUND": -32006, "APPROVAL_NOT_FOUND": -32007,
    "TIMEOUT": -32010, "ALREADY_DECIDED": -32011, "UNKNOWN_TOOL": -32012,
    "LIMIT_EXCEEDED": -32013, "STORAGE_FAILURE": -32014,
}


def test_error_codes():
    for name, code in CODES.items():
        assert getattr(rpc, name) == code
        assert code in rpc.ERROR_NAMES
    assert len(rpc.ERROR_NAMES) == len(CODES)


def one(line):
    msgs = parse_message(line)
    assert isinstance(msgs, Messages) and len(msgs) == 1 and not msgs.is_batch and not msgs.batch
    assert msgs.items == [msgs[0]]
    return msgs[0]


def test_request_notification_response():
    req = one(b'{"jsonrpc":"2.0","id":7,"method":"session.get","params":{"sessionId":"s1"}}\n')
    assert isinstance(req, Request) and req.id == 7 and req.method == "session.get"
    assert msgspec.json.decode(req.params) == {"sessionId": "s1"}
    assert decode_params(req.params, m.SessionGetParams).session_id == "s1"
    req = one(' {"jsonrpc":"2.0","id":"a","method":"session.list"} ')
    assert req == Request("a", "session.list") and not req.params
    assert one(b'{"jsonrpc":"2.0","id":null,"method":"m"}').id is None
    note = one(b'{"jsonrpc":"2.0","method":"stream","params":{"subscriptionId":"x","seq":0,"ops":[["r",{}]]}}')
    assert isinstance(note, Notification)
    assert decode_params(note.params, m.StreamParams).ops == [["r", {}]]
    resp = one(b'{"jsonrpc":"2.0","id":1,"result":null}')
    assert isinstance(resp, Response) and bytes(resp.result) == b"null"
    err = one(b'{"jsonrpc":"2.0","id":1,"error":{"code":-32011,"message":"no","data":{"outcome":"rejected"}}}')
    assert isinstance(err, ErrorResponse) and err.error.code == -32011 and err.error.data == {"outcome": "rejected"}


def test_params_null_is_absent_and_scalar_params_are_invalid():
    assert not one(b'{"jsonrpc":"2.0","id":1,"method":"m","params":null}').params
    bad = one(b'{"jsonrpc":"2.0","id":1,"method":"m","params":3}')
    assert isinstance(bad, RpcError) and bad.code == rpc.INVALID_REQUEST and bad.id == 1


@pytest.mark.parametrize(
    "line, code, id_",
    [
        (b"{not json", rpc.PARSE_ERROR, None),
        (b"", rpc.PARSE_ERROR, None),
        (b'{"jsonrpc":"2.0","id":1,"method":"m"', rpc.PARSE_ERROR, None),
        (b"[1,", rpc.PARSE_ERROR, None),
        (b"\xff\xfe", rpc.PARSE_ERROR, None),
        (b"42", rpc.INVALID_REQUEST, None),
        (b'"str"', rpc.INVALID_REQUEST, None),
        (b"null", rpc.INVALID_REQUEST, None),
        (b'{"id":1,"method":"m"}', rpc.INVALID_REQUEST, 1),
        (b'{"jsonrpc":"1.0","id":"x","method":"m"}', rpc.INVALID_REQUEST, "x"),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"m"}', rpc.INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":true,"method":"m"}', rpc.INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":{"a":1},"method":"m"}', rpc.INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":3,"method":5}', rpc.INVALID_REQUEST, 3),
        (b'{"jsonrpc":"2.0","id":3}', rpc.INVALID_REQUEST, 3),
        (b'{"jsonrpc":"2.0","id":3,"result":1,"error":{"code":1,"message":"x"}}', rpc.INVALID_REQUEST, 3),
        (b'{"jsonrpc":"2.0","id":3,"error":{"code":"x"}}', rpc.INVALID_REQUEST, 3),
        (b'{"jsonrpc":"2.0","result":1}', rpc.INVALID_REQUEST, None),
    ],
)
def test_invalid_lines(line, code, id_):
    msg = one(line)
    assert isinstance(msg, RpcError)
    assert (msg.code, msg.id) == (code, id_)
    assert msg.message


def test_batch():
    line = json.dumps([
        {"jsonrpc": "2.0", "id": 1, "method": "a"},
        {"jsonrpc": "2.0", "method": "b"},
        5,
        {"jsonrpc": "2.0", "id": "z", "method": 1},
        {"jsonrpc": "2.0", "id": 2, "result": {}},
    ]).encode()
    msgs = parse_message(line)
    assert msgs.is_batch and msgs.batch and len(msgs) == 5
    assert isinstance(msgs[0], Request) and isinstance(msgs[1], Notification)
    assert isinstance(msgs[2], RpcError) and msgs[2].id is None
    assert isinstance(msgs[3], RpcError) and msgs[3].id == "z"
    assert isinstance(msgs[4], Response)
    empty = parse_message(b" [ ] ")
    # JSON-RPC 2.0: an empty batch is answered with one error object, not an array.
    assert not empty.is_batch and len(empty) == 1 and empty[0].code == rpc.INVALID_REQUEST


def test_encoders_give_one_line_each():
    lines = [
        encode_response(1, {"text": "a\nb"}),
        encode_error(None, rpc.INVALID_REQUEST, "line too long"),
        encode_error("x", rpc.ALREADY_DECIDED, "decided", {"outcome": "allowed-once"}),
        encode_request(2, "tool.run", {"sessionId": "s", "name": "bash", "arguments": {"command": "ls\n"}}),
        encode_notification("stream", {"subscriptionId": "q", "seq": 0, "ops": [["r", {}]]}),
        encode_request(3, "session.list"),
        encode_response(4, msgspec.Raw(b'{"pre":"encoded"}')),
    ]
    for line in lines:
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert json.loads(line)["jsonrpc"] == "2.0"
    assert json.loads(lines[1]) == {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "line too long"}}
    assert json.loads(lines[2])["error"]["data"] == {"outcome": "allowed-once"}
    assert "params" not in json.loads(lines[5])
    assert json.loads(lines[6])["result"] == {"pre": "encoded"}
    parsed = [one(line) for line in lines]
    assert isinstance(parsed[0], Response) and isinstance(parsed[1], ErrorResponse)
    assert isinstance(parsed[3], Request) and isinstance(parsed[4], Notification)
    batch = encode_batch(lines[:2])
    assert batch.count(b"\n") == 1 and len(parse_message(batch)) == 2
    assert encode_batch([]) == b""


ids = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8))
params_st = st.dictionaries(st.text(max_size=4), st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=5)), max_size=4)


@settings(max_examples=150, deadline=None)
@given(ids, st.text(min_size=1, max_size=12), params_st)
def test_request_round_trip(id_, method, params):
    msg = one(encode_request(id_, method, params))
    assert isinstance(msg, Request) and msg.id == id_ and msg.method == method
    assert msgspec.json.decode(msg.params) == params


def test_rpc_error():
    err = RpcError(rpc.SESSION_NOT_FOUND, "no session s; list them with session.list", {"code": "X"}, id=4)
    assert isinstance(err, Exception) and (err.code, err.data, err.id) == (-32004, {"code": "X"}, 4)
    assert "session.list" in str(err)
    line = encode_error(err.id, err.code, err.message, err.data)
    back = one(line)
    assert isinstance(back, ErrorResponse) and back.id == 4 and back.error.data == {"code": "X"}
