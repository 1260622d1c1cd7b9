"""Pending output sidecars: the checkpointed live output of a running call (STORAGE.md §6).

Theory of operation: while a call runs, the execution room keeps its own wire `Encoder` for
the call's ToolOutput and, at most once a second, hands a wire batch to `PendingOutput`,
which appends one line ``{"n": int, "base": bool, "ops": WireOp[]}`` to
``sessions/<id>/pending/<callId>.ops.jsonl`` and fsyncs. ``n`` counts checkpoints from 0. A
base batch (first op ``r``, which also resets the encoder's table) comes first and at least
every `BASE_EVERY` checkpoints (`PendingOutput.needs_base` says when), so recovery replays at
most that many lines. A failed checkpoint is rolled back to the size before it, like the log.

Recovery (`read_pending_window`) reads the complete lines, goes back to the last base and
applies forward with a fresh `Decoder`: the result seeds the ``TOOL_OUTCOME_UNKNOWN`` result
that crash repair writes; it never discards anything. A torn last line is ignored; a batch that
does not decode or apply ends the replay with the value as it was before that batch.

Retiring: once the call's ``tool/result`` is durable, the owner calls `PendingOutput.retire`
(unlink). Crash between the two: `SessionLog.open_for_write` unlinks sidecars of calls that
have a durable result (`retire_settled`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from dshd.paths import is_valid_id
from protocol.apply import apply
from protocol.codec import Decoder

from .threads import run_sync
from .errors import StorageError, StorageWriteError

BASE_EVERY = 50
PENDING_DIR = "pending"
SUFFIX = ".ops.jsonl"

_encoder = msgspec.json.Encoder()


class _Checkpoint(msgspec.Struct):
    n: int
    base: bool
    ops: list


_line_decoder = msgspec.json.Decoder(_Checkpoint)


def pending_path(session_dir: Path, call_id: str) -> Path:
    """``<session_dir>/pending/<callId>.ops.jsonl``. Raises ValueError for an invalid id."""
    if not is_valid_id(call_id):
        raise ValueError(f"invalid call id: {call_id!r}")
    return Path(session_dir) / PENDING_DIR / f"{call_id}{SUFFIX}"


def fsync_dir(path: Path) -> None:
    """fsync a directory, so an entry made or removed in it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PendingOutput:
    """Checkpoint writer for one running call's output (STORAGE.md §6).

    One per call, used by one task. ``checkpoint(wire_ops, base)`` appends and fsyncs one
    line; ``retire()`` unlinks the file. The session directory must exist.
    """

    def __init__(self, session_dir: Path, call_id: str) -> None:
        self.path = pending_path(session_dir, call_id)
        self.call_id = call_id
        self._fd: int | None = None
        self._size = 0
        self._n = 0
        self._since_base: int | None = None  # lines written since (and including) the last base
        self._parent_unsynced = False  # we made pending/ and its entry is not fsynced yet
        self._retired = False

    @property
    def checkpoints(self) -> int:
        """Number of checkpoints written so far (the next ``n``)."""
        return self._n

    @property
    def needs_base(self) -> bool:
        """True when the next checkpoint must be a base batch (first, or `BASE_EVERY` since)."""
        return self._since_base is None or self._since_base >= BASE_EVERY

    async def checkpoint(self, ops: list, base: bool) -> None:
        """Append ``{"n", "base", "ops"}`` and fsync (runs in a worker thread).

        ``ops`` is a wire batch from the caller's own encoder; ``base`` must be true exactly
        when it starts with ``r``, and must be true when `needs_base`. Raises `ValueError`
        (bad base flag), `StorageWriteError` (write or fsync failed: the file is rolled back
        and this checkpoint did not happen), `StorageError` (retired).
        """
        if self._retired:
            raise StorageError(f"pending output of call {self.call_id} is retired")
        first = ops[0] if ops else None
        starts_with_r = isinstance(first, (list, tuple)) and len(first) > 0 and first[0] == "r"
        if base != starts_with_r:
            raise ValueError("base must be true exactly when the batch starts with an 'r' op")
        if self.needs_base and not base:
            raise ValueError(f"checkpoint {self._n} must be a base batch (every {BASE_EVERY})")
        line = _encoder.encode({"n": self._n, "base": base, "ops": ops}) + b"\n"
        try:
            await run_sync(self._write_sync, line)
        except OSError as e:
            raise StorageWriteError(
                f"checkpointing the output of call {self.call_id} to {self.path} failed ({e})"
            ) from e
        self._n += 1
        self._since_base = 1 if base else (self._since_base or 0) + 1

    def _write_sync(self, line: bytes) -> None:
        if self._fd is None:
            directory = self.path.parent
            if not directory.is_dir():
                try:
                    os.mkdir(directory, 0o700)
                except FileExistsError:
                    pass
                else:
                    self._parent_unsynced = True
            if self._parent_unsynced:  # retried until it succeeds: the entry must be durable
                fsync_dir(directory.parent)
                self._parent_unsynced = False
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                size = os.fstat(fd).st_size
                fsync_dir(directory)
            except BaseException:
                os.close(fd)
                raise
            self._fd, self._size = fd, size
        noted = self._size
        try:
            view = memoryview(line)
            offset = noted
            while view:
                n = os.pwrite(self._fd, view, offset)
                view, offset = view[n:], offset + n
            os.fsync(self._fd)
        except BaseException:
            try:
                os.ftruncate(self._fd, noted)
            except OSError:
                pass
            raise
        self._size = noted + len(line)

    def close(self) -> None:
        """Close the file without unlinking it (the call's result is not durable yet)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def retire(self) -> None:
        """Close and unlink the sidecar; call once the call's ``tool/result`` is durable.
        Idempotent; a missing file is fine."""
        self._retired = True
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def pending_windows(session_dir: Path, call_ids: list[str]) -> dict[str, dict]:
    """callId → its last checkpointed ToolOutput value, for those of ``call_ids`` that have
    one (`read_pending_window`; blocking)."""
    windows = {}
    for call_id in call_ids:
        window = read_pending_window(session_dir, call_id)
        if window is not None:
            windows[call_id] = window
    return windows


def read_pending_window(session_dir: Path, call_id: str) -> dict | None:
    """The last checkpointed ToolOutput value of a call, or None (STORAGE.md §6).

    Replays from the last base line with a fresh decoder. None when there is no sidecar, no
    complete base line, or the replayed value is not an object. Blocking; never raises for
    the file's content (`ValueError` for an invalid id, `OSError` other than not-found).
    """
    path = pending_path(session_dir, call_id)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    records: list[_Checkpoint] = []
    for line in data.split(b"\n")[:-1]:  # the last piece is empty or a torn line
        try:
            records.append(_line_decoder.decode(line))
        except msgspec.DecodeError:
            break
    last_base = max((i for i, r in enumerate(records) if r.base), default=None)
    if last_base is None:
        return None
    decoder = Decoder()
    doc: Any = None
    for record in records[last_base:]:
        try:
            doc = apply(doc, decoder.decode(record.ops))
        except ValueError:  # OpError: keep the value as of the last good batch
            break
    return doc if isinstance(doc, dict) else None


def retire_settled(session_dir: Path, call_ids: list[str]) -> int:
    """Unlink the sidecars of calls whose ``tool/result`` is durable; return how many.

    Blocking. Invalid ids are skipped (they never became file names).
    """
    removed = 0
    for call_id in call_ids:
        if not is_valid_id(call_id):
            continue
        try:
            os.unlink(pending_path(session_dir, call_id))
            removed += 1
        except FileNotFoundError:
            pass
    return removed
