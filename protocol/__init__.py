"""dsh's pure protocol layer: ops, their wire codec, the tracker and JSON-RPC messages.

Theory of operation: everything in this package is a pure function or a plain state machine
(sans-IO, after h11). It imports the standard library and msgspec only — never trio, socket,
os, time or asyncio (``tests/protocol/test_protocol_purity.py`` walks the imports). The daemon owns all
I/O and feeds bytes and values through here:

* ``ops`` / ``errors``: the six verbs, path and value rules, ``OpError`` (OPS.md §1–§2);
* ``apply``: a batch onto a plain JSON value, the only thing a mirroring client needs;
* ``codec``: ``Encoder`` / ``Decoder`` for the wire form (path ids, shortened ops; OPS.md §3);
* ``tracker``: ``Tracker`` turns writes to producer state into minimal batches (OPS.md §5),
  ``diff`` the ops between a snapshot and the live value;
* ``mirror``: the consumer half of a stream (decode + apply a lane's batches);
* ``rpc``: the JSON-RPC 2.0 envelope: parse/encode, error codes, ``decode_params``
  (PROTOCOL.md §1, §4);
* ``methods``: every method's params and result structs and the one method table
  (PROTOCOL.md §2–§3); ``events``: a session's events as a tagged union (STORAGE.md §3);
  ``ids``: the id rule (PROTOCOL.md §3.1); ``lane``: the lane view and the ToolResult as
  structs; ``jsonview``: a struct read by its wire names, as the JSON object it encodes to;
  ``framing``: NDJSON line framing for both shells.
"""

from .apply import apply, is_base
from .codec import MAX_TABLE, Decoder, Encoder, decode_json, encode_json
from .errors import OpError
from .ops import RESERVED, check_json_value, check_path, validate_op
from .tracker import Tracker, TrackerStatistics

__all__ = [
    "MAX_TABLE",
    "RESERVED",
    "Decoder",
    "Encoder",
    "OpError",
    "Tracker",
    "TrackerStatistics",
    "apply",
    "check_json_value",
    "check_path",
    "decode_json",
    "encode_json",
    "is_base",
    "validate_op",
]
