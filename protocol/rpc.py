"""JSON-RPC 2.0 messages of the dshd client protocol, sans-IO (PROTOCOL.md §1–§4).

Theory of operation: the transport hands this module one line (one JSON text, the trailing
``\\n`` optional) and gets back a list of classified messages; to answer, it asks for bytes.
Nothing here reads, writes, or knows about connections or sessions.

* ``parse_message(line) -> Messages``: a single object or a batch array. Each element becomes a
  ``Request`` (has ``id``), a ``Notification`` (no ``id``), a ``Response`` / ``ErrorResponse``
  (the client side), or an ``RpcError`` (code ``INVALID_REQUEST``, carrying the element's
  ``id`` when it could be read, else ``None``; a message with both ``method`` and
  ``result``/``error`` is one too, ``id`` None). Malformed JSON is one
  ``RpcError(PARSE_ERROR)`` (a lone UTF-16 surrogate escape such as ``\\ud800``, which
  msgspec reports as "Input data was truncated", is named as such: :func:`bad_json_reason`);
  an empty batch, and a batch longer than ``max_batch``, is one
  ``INVALID_REQUEST``. ``Messages.is_batch`` says whether the line was
  an array. ``params`` and ``result`` stay ``msgspec.Raw`` (undecoded bytes) until the handler
  knows what it expects.
* ``decode_params(raw, Type)``: the method's params struct, or ``RpcError(-32602)``
  whose message names the field (``"invalid params: Expected `int` <= 10000 - at `$.limit`"``).
  Absent and ``null`` params decode as ``{}``. Unknown fields are ignored (new fields may be
  added, PROTOCOL.md intro).
* ``encode_response`` / ``encode_error`` / ``encode_request`` / ``encode_notification``: one
  compact JSON line ending in ``b"\\n"``. ``result``/``params`` may be any msgspec-encodable
  value (dicts, Structs, ``msgspec.Raw`` for pre-encoded JSON).

The structs ``decode_params`` decodes into, and the one method table, are
``protocol.methods``; this module knows no method.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import UNSET, Raw

__all__ = [
    "ALREADY_DECIDED",
    "APPROVAL_NOT_FOUND",
    "CALL_NOT_FOUND",
    "ERROR_NAMES",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "LIMIT_EXCEEDED",
    "METHOD_NOT_FOUND",
    "NOT_INITIALIZED",
    "PARSE_ERROR",
    "PERMISSION_DENIED",
    "SESSION_LOCKED",
    "SESSION_NOT_FOUND",
    "STORAGE_FAILURE",
    "TIMEOUT",
    "UNKNOWN_TOOL",
    "UNSUPPORTED_VERSION",
    "ErrorObject",
    "ErrorResponse",
    "Messages",
    "Notification",
    "Request",
    "Response",
    "RpcError",
    "bad_json_reason",
    "decode_params",
    "encode_batch",
    "encode_error",
    "encode_notification",
    "encode_request",
    "encode_response",
    "parse_message",
]

# --- error codes (PROTOCOL.md §4) ---------------------------------------------------------------

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
PERMISSION_DENIED = -32001
NOT_INITIALIZED = -32002
UNSUPPORTED_VERSION = -32003
SESSION_NOT_FOUND = -32004
SESSION_LOCKED = -32005
CALL_NOT_FOUND = -32006
APPROVAL_NOT_FOUND = -32007
TIMEOUT = -32010
ALREADY_DECIDED = -32011
UNKNOWN_TOOL = -32012
LIMIT_EXCEEDED = -32013
STORAGE_FAILURE = -32014

#: code -> short name, for logs.
ERROR_NAMES: dict[int, str] = {
    PARSE_ERROR: "parse error",
    INVALID_REQUEST: "invalid request",
    METHOD_NOT_FOUND: "method not found",
    INVALID_PARAMS: "invalid params",
    INTERNAL_ERROR: "internal error",
    PERMISSION_DENIED: "permission denied",
    NOT_INITIALIZED: "not initialized",
    UNSUPPORTED_VERSION: "unsupported protocol version",
    SESSION_NOT_FOUND: "session not found",
    SESSION_LOCKED: "session locked by another process",
    CALL_NOT_FOUND: "call not found",
    APPROVAL_NOT_FOUND: "approval not found",
    TIMEOUT: "timeout",
    ALREADY_DECIDED: "already decided",
    UNKNOWN_TOOL: "unknown tool",
    LIMIT_EXCEEDED: "limit exceeded",
    STORAGE_FAILURE: "storage failure",
}


class RpcError(Exception):
    """A JSON-RPC error: ``code`` (int, §4), ``message`` (str), ``data`` (JSON or None).

    Raised by ``decode_params`` (and by handlers); returned, not raised, by ``parse_message``
    for elements that are not valid messages, with ``id`` set to the element's id when it could
    be read (else ``None``). Answer one with ``encode_error(id, e.code, e.message, e.data)``.
    """

    def __init__(self, code: int, message: str, data: Any = None, *, id: Any = None) -> None:
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message
        self.data = data
        self.id = id

    def __repr__(self) -> str:
        return f"RpcError({self.code}, {self.message!r}, data={self.data!r}, id={self.id!r})"


# --- message structs ----------------------------------------------------------------------------

Id = int | str | None


class Request(msgspec.Struct, frozen=True):
    """A call that wants an answer. ``params``: undecoded JSON (empty ``Raw`` when absent)."""

    id: Id
    method: str
    params: Raw = Raw()


class Notification(msgspec.Struct, frozen=True):
    """A call without ``id``: never answered (PROTOCOL.md §1, batches)."""

    method: str
    params: Raw = Raw()


class Response(msgspec.Struct, frozen=True):
    """A successful answer; ``result`` is undecoded JSON (decode with ``msgspec.json.decode``)."""

    id: Id
    result: Raw


class ErrorObject(msgspec.Struct, frozen=True, omit_defaults=True):
    """The ``error`` member of an error answer."""

    code: int
    message: str
    data: Any = None


class ErrorResponse(msgspec.Struct, frozen=True):
    """An error answer (the client side); ``error.data`` is already decoded."""

    id: Id
    error: ErrorObject


class Messages(list):
    """The classified elements of one line (a list).

    ``is_batch`` (alias ``batch``) is True when the line was a JSON array: answer the requests
    in it with one array line (``encode_batch``). ``items`` is the list itself.
    """

    is_batch: bool = False

    @property
    def batch(self) -> bool:
        return self.is_batch

    @property
    def items(self) -> list:
        return self


class _Envelope(msgspec.Struct):
    jsonrpc: Any = UNSET
    id: Any = UNSET
    method: Any = UNSET
    params: Raw = Raw()
    result: Raw = Raw()
    error: Any = UNSET


_envelope_decoder = msgspec.json.Decoder(_Envelope)
_batch_decoder = msgspec.json.Decoder(list[Raw])
_error_object_decoder = msgspec.json.Decoder(ErrorObject)
_encoder = msgspec.json.Encoder()
_WS = b" \t\r\n"


def _first_byte(data: Any) -> bytes:
    for b in memoryview(data).cast("B"):
        if b not in _WS:
            return bytes((b,))
    return b""


def _classify(raw: Any) -> Any:
    try:
        env = _envelope_decoder.decode(raw)
    except msgspec.ValidationError:
        return RpcError(INVALID_REQUEST, "invalid request: a message is a JSON object")
    rid = env.id
    id_ok = rid is UNSET or rid is None or type(rid) is str or type(rid) is int
    known_id = rid if (id_ok and rid is not UNSET) else None
    if env.jsonrpc != "2.0":
        return RpcError(INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"', id=known_id)
    if not id_ok:
        return RpcError(INVALID_REQUEST, "invalid request: id must be a string, an integer or null")
    if env.method is not UNSET:
        if env.result or env.error is not UNSET:  # neither a call nor an answer: no id echoed
            return RpcError(
                INVALID_REQUEST, "invalid request: a message has a method or a result/error, not both"
            )
        if type(env.method) is not str:
            return RpcError(
                INVALID_REQUEST, "invalid request: method must be a string", id=known_id
            )
        params = env.params
        if params:
            first = _first_byte(params)
            if first == b"n":  # null: treated as absent
                params = Raw()
            elif first not in (b"{", b"["):
                return RpcError(
                    INVALID_REQUEST, "invalid request: params must be an object", id=known_id
                )
        if rid is UNSET:
            return Notification(env.method, params)
        return Request(rid, env.method, params)
    has_result = bool(env.result)
    has_error = env.error is not UNSET
    if (has_result or has_error) and rid is not UNSET:
        if has_result and has_error:
            return RpcError(
                INVALID_REQUEST, "invalid response: both result and error", id=known_id
            )
        if has_result:
            return Response(rid, env.result)
        try:
            error = msgspec.convert(env.error, ErrorObject)
        except msgspec.ValidationError as e:
            return RpcError(INVALID_REQUEST, f"invalid response: error object: {e}", id=known_id)
        return ErrorResponse(rid, error)
    return RpcError(
        INVALID_REQUEST,
        "invalid request: not a request (method, id), a notification (method)"
        " or a response (id, result or error)",
        id=known_id,
    )


def parse_message(
    line: bytes | bytearray | memoryview | str, *, max_batch: int | None = None
) -> Messages:
    """Classify one line (PROTOCOL.md §1); see the module docstring.

    Returns a ``Messages`` list of ``Request | Notification | Response | ErrorResponse |
    RpcError``; never raises on bad input. A batch of more than ``max_batch`` entries is one
    ``INVALID_REQUEST`` (not a batch, ``id`` None): none of its entries is classified.
    """
    out = Messages()
    if isinstance(line, str):
        line = line.encode("utf-8", "surrogatepass")
    try:
        if _first_byte(line) == b"[":
            elements = _batch_decoder.decode(line)
            if not elements:  # JSON-RPC 2.0: an empty batch gets one error object, not an array
                out.append(RpcError(INVALID_REQUEST, "invalid request: empty batch"))
                return out
            if max_batch is not None and len(elements) > max_batch:
                out.append(RpcError(
                    INVALID_REQUEST,
                    f"invalid request: a batch has at most {max_batch} entries, this one has "
                    f"{len(elements)}; none of it ran: send it in parts",
                ))
                return out
            out.is_batch = True  # a malformed array is one parse error, answered unbatched
            for element in elements:
                out.append(_classify(element))
        else:
            out.append(_classify(line))
    except msgspec.ValidationError:  # a subclass of DecodeError: keep first
        out.append(RpcError(INVALID_REQUEST, "invalid request"))
    except msgspec.DecodeError as e:
        out.append(RpcError(PARSE_ERROR, f"parse error: {bad_json_reason(line, e)}; "
                                         "send one JSON text per line"))
    except RecursionError:
        out.clear()
        out.is_batch = False
        out.append(RpcError(PARSE_ERROR, "parse error: JSON nested too deeply"))
    return out


# --- encoding -----------------------------------------------------------------------------------


def _line(obj: Any) -> bytes:
    return _encoder.encode(obj) + b"\n"


def encode_response(id: Id, result: Any) -> bytes:
    """``{"jsonrpc":"2.0","id":id,"result":result}`` + ``\\n``."""
    return _line({"jsonrpc": "2.0", "id": id, "result": result})


def encode_error(id: Id, code: int, message: str, data: Any = None) -> bytes:
    """``{"jsonrpc":"2.0","id":id,"error":{"code","message","data"?}}`` + ``\\n``.

    ``data`` is left out when None. ``id`` is None when the request's id is unknown.
    """
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return _line({"jsonrpc": "2.0", "id": id, "error": error})


def encode_request(id: Id, method: str, params: Any = None) -> bytes:
    """``{"jsonrpc":"2.0","id","method","params"?}`` + ``\\n`` (params left out when None)."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        msg["params"] = params
    return _line(msg)


def encode_notification(method: str, params: Any = None) -> bytes:
    """``{"jsonrpc":"2.0","method","params"?}`` + ``\\n`` (params left out when None)."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return _line(msg)


def encode_batch(lines: list[bytes]) -> bytes:
    """Join encoded lines (from the ``encode_*`` functions) into one batch array line.

    An empty list gives ``b""``: a batch of only notifications gets no answer at all.
    """
    if not lines:
        return b""
    return b"[" + b",".join(line.rstrip(b"\n") for line in lines) + b"]\n"


# --- decoding params and results ------------------------------------------------------------

_param_decoders: dict[type, msgspec.json.Decoder] = {}

#: One escape of a JSON string: ``\uXXXX`` (group 1: the hex digits) or ``\`` + one character.
_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def _lone_surrogate(data: bytes | bytearray | memoryview | str) -> str | None:
    """The first ``\\uXXXX`` escape of ``data`` that is a UTF-16 surrogate without its pair
    (a high one not followed at once by a low one, or a low one on its own), else None."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    pending: re.Match | None = None  # a high surrogate waiting for its low half
    for m in _ESCAPE.finditer(raw):
        unit = int(m.group(1), 16) if m.group(1) else None
        if pending is not None:
            if m.start() == pending.end() and unit is not None and 0xDC00 <= unit <= 0xDFFF:
                pending = None
                continue
            return pending.group(0).decode()
        if unit is not None and 0xD800 <= unit <= 0xDBFF:
            pending = m
        elif unit is not None and 0xDC00 <= unit <= 0xDFFF:
            return m.group(0).decode()
    return pending.group(0).decode() if pending is not None else None


def bad_json_reason(data: bytes | bytearray | memoryview | str, exc: Exception) -> str:
    """What is wrong with JSON that msgspec refused with ``exc``, in words a person can act on:
    a lone surrogate escape is named (msgspec says "Input data was truncated" or "invalid
    utf-16 surrogate pair"), anything else is msgspec's own message. Only called on the error
    path: the scan costs nothing on valid input."""
    lone = _lone_surrogate(data)
    if lone is None:
        return str(exc)
    return (f"invalid JSON: a string holds a lone UTF-16 surrogate ({lone}); strings must be "
            "valid Unicode (a surrogate escape needs its pair, high then low)")


#: The field a msgspec validation message names at its end: "... - at `$.a.b[0]`".
_AT_FIELD = re.compile(r"- at `\$\.([^`]+)`$")
_MISSING_FIELD = re.compile(r"Object missing required field `([^`]+)`")


def _field_of(message: str) -> str | None:
    """The dotted path a msgspec message names (what a client reads): ``... - at
    `$.arguments.n``` -> ``arguments.n``; a missing field ``Object missing required field
    `sessionId``` (``- at `$.x``` inside ``x``) -> ``sessionId`` (``x.sessionId``)."""
    where = _AT_FIELD.search(message)
    missing = _MISSING_FIELD.match(message)
    if missing:
        return f"{where.group(1)}.{missing.group(1)}" if where else missing.group(1)
    return where.group(1) if where else None


def decode_params(raw: Any, type_: type) -> Any:
    """Decode ``raw`` (``msgspec.Raw``, bytes or str; empty or ``null`` means ``{}``) as ``type_``.

    Raises ``RpcError(INVALID_PARAMS)`` whose message names the offending field, with
    ``data = {"detail": <msgspec message>, "field"?: "dotted.path"}``.
    """
    data: Any = raw.encode("utf-8") if isinstance(raw, str) else raw
    if data is None or not data or (len(data) < 16 and bytes(data).strip() == b"null"):
        data = b"{}"
    decoder = _param_decoders.get(type_)
    if decoder is None:
        decoder = _param_decoders[type_] = msgspec.json.Decoder(type_)
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as e:
        detail: dict[str, Any] = {"detail": str(e)}
        field = _field_of(str(e))
        if field:
            detail["field"] = field
        raise RpcError(
            INVALID_PARAMS,
            f"invalid params: {e}; see PROTOCOL.md §3 for the method's params",
            detail,
        ) from None
    except msgspec.DecodeError as e:
        raise RpcError(INVALID_PARAMS,
                       f"invalid params: malformed JSON: {bad_json_reason(data, e)}") from None
