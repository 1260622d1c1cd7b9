"""Session logs written by hand for the fsck tests of both checks: the daemon's offline one
(``tests/storage/test_storage_fsck.py``) and the client's ``dsh fsck`` (``tests/client``).

:func:`make_state_dir` builds one state directory with a session in every offline state:
``aok`` clean, ``btorn`` a torn last frame, ``cbad`` a damaged frame, ``dopen`` calls and an
approval left open (``needs-repair``), ``egap`` a seq gap (damaged), ``fnolog`` no log.
"""

from __future__ import annotations

import json
from pathlib import Path

import zstandard


def ev(seq: int, type_: str, **data) -> dict:
    return {"seq": seq, "time": 0, "type": type_, "data": data}


HEADER = '{{"type":"session","version":1,"id":"{sid}","createdAt":0,"cwd":"/w","title":null}}\n'
#: A crash left these open: two calls, one of them asked for approval.
OPEN = [
    ev(0, "approval/policy", policy="ask", source="config"),
    ev(1, "tool/call", callId="c1", name="bash", arguments='{"command":"make"}'),
    ev(2, "tool/call", callId="c2", name="bash", arguments='{"command":"ls"}'),
    ev(3, "approval/asked", approvalId="a-2", callId="c2", tool="bash", summary="ls"),
]
#: Two batches, everything settled.
CLEAN = [[ev(0, "approval/policy", policy="ask", source="config"),
          ev(1, "tool/call", callId="c1", name="bash", arguments="{}")],
         [ev(2, "tool/result", callId="c1", isError=False, content="", details={})]]


def log_lines(sid: str, events: list[dict]) -> list[bytes]:
    """The header line, then one line per event."""
    return [HEADER.format(sid=sid).encode()] + [
        (json.dumps(e, separators=(",", ":")) + "\n").encode() for e in events]


def zstd_log(state: Path, sid: str, batches: list[list[dict]]) -> Path:
    """A zstd log: a header frame, then one checksummed frame per batch."""
    d = state / "sessions" / sid
    d.mkdir(parents=True)
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    data = cctx.compress(log_lines(sid, [])[0])
    for batch in batches:
        data += cctx.compress(b"".join(log_lines(sid, batch)[1:]))
    path = d / "session.v1.jsonl.zst"
    path.write_bytes(data)
    return path


def plain_log(state: Path, sid: str, text: bytes) -> Path:
    d = state / "sessions" / sid
    d.mkdir(parents=True)
    path = d / "session.v1.jsonl"
    path.write_bytes(text)
    return path


def make_state_dir(root: Path) -> Path:
    """The state directory of the module doc, under ``root``."""
    zstd_log(root, "aok", CLEAN)
    torn = zstd_log(root, "btorn", CLEAN)
    torn.write_bytes(torn.read_bytes()[:-3])  # the last frame lost its checksum: torn
    bad = zstd_log(root, "cbad", CLEAN)
    raw = bytearray(bad.read_bytes())
    raw[raw.index(b"\x28\xb5\x2f\xfd", 4) + 12] ^= 0x55
    bad.write_bytes(bytes(raw))
    zstd_log(root, "dopen", [OPEN])
    plain_log(root, "egap", b"".join(log_lines("egap", [OPEN[0], OPEN[2]])))  # seq 0 then 2
    (root / "sessions" / "fnolog").mkdir()
    return root


def snapshot(root: Path) -> dict:
    """Every file's bytes and mtime: equal before and after means nothing was written."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}
