"""The calls a session knows, in bounded memory: the exact id index and the results cache.

Theory of operation: a session must answer, for every call id it ever saw, "is it known"
(duplicate refusal, ``CallNotFound``) and "where is its ``tool/result``" (``tool.wait`` on a
call settled long ago), but it must not keep every result in memory (issue 14: an open
session's memory is bounded). Two parts:

* :class:`CallIndex` -- every known call id with the seq of its ``tool/result`` (``-1``: no
  result yet). Exact, never a filter: a lookup that says "known" names a real id. Two levels:
  recent ids in a plain ``dict`` (about 130 bytes a call: the key string, the int, the slot),
  and, once that holds more than ``max(FREEZE_MIN, frozen / 4)`` settled ids, all settled ids
  are merged into one *frozen* level: the ids sorted, joined in one ``bytes`` (the id and a
  newline: ids are ``protocol.ids`` names, at most 64 ASCII characters, never a newline),
  their start offsets in an ``array('I')`` and their seqs in an ``array('q')``: about
  ``len(id) + 13`` bytes a call (31 bytes for a 18-character ``m-<16 hex>`` id). A lookup
  there is a binary search (``log2(n)`` slices). The merge is linear; the threshold grows with
  the frozen level, so each id is merged O(log n) times over the session's life. Unsettled
  ids stay in the dict (bounded by the running and proposed calls).
  **In the snapshot** (``log/snapshot``'s ``session`` dict) the index is written as a
  *delta*: only the ids added or settled since the last durable snapshot
  (:meth:`CallIndex.delta`), about ``len(id) + 10`` bytes an entry, each call in at most two
  deltas (its ``tool/call`` and its ``tool/result`` may fall on either side of a snapshot).
  The snapshot bytes over a session's life are thus proportional to its calls, never to
  calls x snapshots; an open folds the deltas along the snapshot ``prev`` chain
  (``dshd.sessions.chain``) and builds the index in one go (:meth:`from_entries`).
  :meth:`to_json` / :meth:`from_json` are the whole index in one dict (the version-1
  snapshot form, still read as the base of a chain).
* **Digests.** Each id also carries a 64-bit digest of its call's tool name and arguments
  (:func:`call_digest`, blake2b of the name and the arguments' sorted JSON without the
  terminal's size, numbers compared by value as OPS.md §1 says -- an integral float is its
  integer: ``timeout: 5.0`` is ``timeout: 5``), so that a ``tool.run`` reusing a known id with other arguments is refused
  (``CALL_ID_REUSED``) while a retry of the same call still answers ``existing``: 8 bytes a
  call in the frozen level (``array('Q')``), a dict entry in the recent level, and in the
  snapshot next to each delta (``digests``: id -> 16 hex digits). ``0`` means "not known"
  (a call logged by a daemon before digests, or a model's call proposed and never started):
  such a call is taken as the same (``existing``), as before. A digest logged before numbers
  compared by value (:func:`legacy_digest`: the JSON as decoded) differs from the new one only
  when the arguments hold an integral float; :meth:`KnownCalls.check_reuse` takes either, so
  every digest already in a snapshot stays valid.
* :class:`ResultCache` -- an LRU of at most ``capacity`` settled results (dicts, as logged).
  A result that fell out is read back from the log by its seq (:class:`KnownCalls`).
* :class:`KnownCalls` -- the call table's view of both, plus what only unsettled calls need
  (names, logged ``tool/call`` events, waiters): nothing per settled call but its index entry.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from array import array
from bisect import bisect_left
from collections import OrderedDict
from typing import Any, Awaitable, Callable

import msgspec
import trio

from ..errors import InvalidParams

__all__ = ["CallIndex", "FREEZE_MIN", "KnownCalls", "ResultCache", "UNSETTLED", "call_digest",
           "legacy_digest"]

#: The smallest number of settled ids in the dict level before they are frozen.
FREEZE_MIN = 4096
#: The seq of a known call that has no ``tool/result`` (yet).
UNSETTLED = -1
#: ``KnownCalls.settled_result`` of a settled call whose result is no longer in memory.
SETTLED_ELSEWHERE: dict = {"settled": True}
#: Arguments a retry may change without being another call: the terminal's size.
_PRESENTATION = frozenset({"cols", "rows"})
_sorted_json = msgspec.json.Encoder(order="sorted")


def call_digest(name: str, arguments: object) -> int:
    """The 64-bit digest of a call (module doc): ``arguments`` as a dict or as its logged JSON
    text, numbers by value; 0 when they do not decode (a digest that is not known)."""
    return _digest(name, arguments, _by_value)


def legacy_digest(name: str, arguments: object) -> int:
    """The digest as logged before numbers compared by value (module doc)."""
    return _digest(name, arguments, lambda v: v)


#: Integral floats below this magnitude are their integers (exact in a float; an int64).
_INT_FLOAT_MAX = 2.0 ** 63


def _by_value(value: object) -> object:
    """``value`` with every integral float as its integer (``5.0`` -> ``5``, ``-0.0`` -> 0)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < _INT_FLOAT_MAX else value
    if isinstance(value, dict):
        return {k: _by_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_by_value(v) for v in value]
    return value


def _digest(name: str, arguments: object, canonical: Callable[[object], object]) -> int:
    if isinstance(arguments, (str, bytes)):
        try:
            arguments = msgspec.json.decode(arguments)
        except msgspec.DecodeError:
            return 0
    if not isinstance(arguments, dict):
        return 0
    kept = canonical({k: v for k, v in arguments.items() if k not in _PRESENTATION})
    h = hashlib.blake2b(name.encode("utf-8", "replace") + b"\0" + _sorted_json.encode(kept),
                        digest_size=8)
    return int.from_bytes(h.digest(), "big") or 1


class _Frozen:
    """Sorted ids in one bytes blob; a sequence of ``bytes`` for ``bisect`` (module doc)."""

    __slots__ = ("blob", "starts", "seqs", "digests")

    def __init__(self, ids: list[bytes] | None = None, seqs: list[int] | None = None,
                 digests: list[int] | None = None) -> None:
        ids = ids or []
        self.digests = array("Q", digests or [0] * len(ids))
        self.blob = b"\n".join(ids) + (b"\n" if ids else b"")
        self.starts = array("I")
        pos = 0
        for cid in ids:
            self.starts.append(pos)
            pos += len(cid) + 1
        self.seqs = array("q", seqs or [])

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> bytes:
        start = self.starts[i]
        return self.blob[start: self.blob.index(b"\n", start)]

    def find(self, key: bytes) -> int:
        """Index of ``key``, or -1."""
        i = bisect_left(self, key)
        return i if i < len(self) and self[i] == key else -1

    def items(self) -> list[tuple[bytes, int]]:
        return list(zip(self.blob.split(b"\n")[:-1], self.seqs))

    def nbytes(self) -> int:
        return (sys.getsizeof(self.blob) + self.starts.itemsize * len(self.starts)
                + self.seqs.itemsize * len(self.seqs) + self.digests.itemsize * len(self.digests))


class CallIndex:
    """Every call id a session knows -> the seq of its ``tool/result`` (module doc)."""

    def __init__(self) -> None:
        self._recent: dict[str, int] = {}
        #: id -> digest of the recent ids whose digest is known (module doc).
        self._digests: dict[str, int] = {}
        self._settled_recent = 0
        self._frozen = _Frozen()
        #: id -> generation of its last change (add or settle) since the last durable
        #: snapshot (``delta``); bounded by the calls between two snapshots.
        self._changed: dict[str, int] = {}
        self._gen = 0
        #: (seq, generation) of the snapshots a delta was handed to and not yet seen durable.
        self._handed: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self._recent) + len(self._frozen)

    def __contains__(self, call_id: str) -> bool:
        return self.get(call_id) is not None

    def get(self, call_id: str) -> int | None:
        """The seq of the call's ``tool/result`` (:data:`UNSETTLED`: none yet); None: unknown."""
        seq = self._recent.get(call_id)
        if seq is not None:
            return seq
        try:
            key = call_id.encode("ascii")
        except UnicodeEncodeError:
            return None
        i = self._frozen.find(key)
        return None if i < 0 else self._frozen.seqs[i]

    def add(self, call_id: str, digest: int = 0) -> None:
        """Make ``call_id`` known (no result yet); a known id keeps what it has, and takes
        ``digest`` when it had none."""
        if self.get(call_id) is None:
            self._recent[call_id] = UNSETTLED
            self._changed[call_id] = self._gen
        if digest and not self.digest(call_id):
            i = self._frozen.find(call_id.encode("ascii", "replace"))
            if i >= 0:
                self._frozen.digests[i] = digest
            else:
                self._digests[call_id] = digest
            self._changed[call_id] = self._gen

    def digest(self, call_id: str) -> int:
        """The digest of a known call (0: not known, module doc)."""
        if call_id in self._recent:
            return self._digests.get(call_id, 0)
        i = self._frozen.find(call_id.encode("ascii", "replace"))
        return self._frozen.digests[i] if i >= 0 else 0

    def digests_of(self, ids) -> dict[str, str]:
        """``ids`` -> their known digests as 16 hex digits (a snapshot's ``digests``)."""
        return {cid: f"{d:016x}" for cid in ids if (d := self.digest(cid))}

    def settle(self, call_id: str, seq: int) -> None:
        """``call_id``'s ``tool/result`` has ``seq``."""
        self._changed[call_id] = self._gen
        key = call_id.encode("ascii", "replace")
        i = self._frozen.find(key)
        if i >= 0:
            self._frozen.seqs[i] = seq
            return
        old = self._recent.get(call_id)
        self._recent[call_id] = seq
        if old is None or old == UNSETTLED:
            self._settled_recent += 1
        if self._settled_recent > max(FREEZE_MIN, len(self._frozen) // 4):
            self._freeze()

    def _freeze(self) -> None:
        """Merge the settled ids of the dict level into the frozen level (module doc)."""
        moved = {cid: seq for cid, seq in self._recent.items() if seq != UNSETTLED}
        for cid in moved:
            del self._recent[cid]
        merged = sorted([(k, s, d) for (k, s), d in zip(self._frozen.items(), self._frozen.digests)]
                        + [(cid.encode("ascii", "replace"), seq, self._digests.pop(cid, 0))
                           for cid, seq in moved.items()])
        self._frozen = _Frozen([k for k, _, _ in merged], [s for _, s, _ in merged],
                               [d for _, _, d in merged])
        self._settled_recent = 0

    def nbytes(self) -> int:
        """Bytes this index holds (the frozen arrays exactly; the dict as Python sizes it)."""
        recent = sys.getsizeof(self._recent) + sys.getsizeof(self._digests) + sum(
            sys.getsizeof(k) + sys.getsizeof(v) for k, v in self._recent.items()) + sum(
            sys.getsizeof(v) for v in self._digests.values())
        return recent + self._frozen.nbytes()

    # ---------------------------------------------------------------- snapshot form
    def delta(self, durable_seq: int, snapshot_seq: int) -> dict[str, int]:
        """The entries (id -> result seq) added or settled since the last durable snapshot,
        for the snapshot about to be written at ``snapshot_seq``; ``durable_seq``: the seq of
        the log's last durable snapshot (-1: none). A delta handed to a snapshot that became
        durable is forgotten; one handed to a snapshot still being written is kept (and
        repeated in the next delta, whose ``prev`` names the same durable snapshot)."""
        cut = None
        for seq, gen in self._handed:
            if seq == durable_seq:
                cut = gen  # the last hand-out at that seq is the one written
        if cut is not None:
            self._changed = {cid: g for cid, g in self._changed.items() if g > cut}
        self._handed = [(seq, gen) for seq, gen in self._handed if seq > durable_seq]
        out = {cid: self.get(cid) for cid in self._changed}
        self._handed.append((snapshot_seq, self._gen))
        self._gen += 1
        return out

    def forget_changes(self) -> None:
        """Everything known is in a durable snapshot (an index just built from the log)."""
        self._changed.clear()
        self._handed.clear()

    def entries(self) -> dict[str, int]:
        """Every id -> result seq (tests and the full-read fallback; linear)."""
        out = {k.decode("ascii"): v for k, v in self._frozen.items()}
        out.update(self._recent)
        return out

    @classmethod
    def from_entries(cls, entries: dict[str, int],
                     digests: dict[str, int] | None = None) -> CallIndex:
        """An index of ``entries`` (id -> result seq or :data:`UNSETTLED`) and their known
        ``digests``, built in one sort: the settled ids frozen, the unsettled ones in the dict
        level; no changes."""
        digests = digests or {}
        index = cls()
        settled = sorted((cid.encode("ascii", "replace"), seq, digests.get(cid, 0))
                         for cid, seq in entries.items() if seq != UNSETTLED)
        index._frozen = _Frozen([k for k, _, _ in settled], [s for _, s, _ in settled],
                                [d for _, _, d in settled])
        index._recent = {cid: seq for cid, seq in entries.items() if seq == UNSETTLED}
        index._digests = {cid: digests[cid] for cid in index._recent if digests.get(cid)}
        return index

    def to_json(self) -> dict:
        """The compact form for the snapshot: the frozen level as it is (its blob as one
        string, its offsets and seqs in base64) and the dict level as a dict. Cheap: no sort,
        no per-id work for the frozen ids (it runs in the writer's turn, STORAGE.md §7)."""
        f = self._frozen
        return {"ids": f.blob.decode("ascii"), "starts": _b64(f.starts), "seqs": _b64(f.seqs),
                "digests": _b64(f.digests), "recent": dict(self._recent),
                "recentDigests": self.digests_of(self._recent)}

    @classmethod
    def from_json(cls, d: object) -> CallIndex:
        """The index of :meth:`to_json`; ValueError when ``d`` is not one."""
        if not isinstance(d, dict) or not all(isinstance(d.get(k), str)
                                              for k in ("ids", "starts", "seqs")):
            raise ValueError("the snapshot's call index is not {ids, starts, seqs, recent}")
        recent = d.get("recent")
        if not isinstance(recent, dict) or not all(
                isinstance(k, str) and type(v) is int for k, v in recent.items()):
            raise ValueError("the snapshot's call index has no valid recent part")
        f = _Frozen()
        f.blob = d["ids"].encode("ascii")
        f.starts = _unb64("I", d["starts"])
        f.seqs = _unb64("q", d["seqs"])
        n = len(f.starts)
        f.digests = (_unb64("Q", d["digests"]) if isinstance(d.get("digests"), str)
                     else array("Q", [0] * n))
        if len(f.seqs) != n or len(f.digests) != n or (n and (f.starts[0] != 0 or not f.blob.endswith(b"\n"))) or (
                not n and f.blob):
            raise ValueError("the snapshot's call index is damaged (offsets, seqs and ids "
                             "disagree)")
        index = cls()
        index._frozen = f
        index._recent = dict(recent)
        index._digests = parse_digests(d.get("recentDigests"))
        index._settled_recent = sum(1 for v in recent.values() if v != UNSETTLED)
        return index


def parse_digests(d: object) -> dict[str, int]:
    """A snapshot's ``digests`` (id -> 16 hex digits) as ints; absent: none. ValueError when
    it is there and is not one."""
    if d is None:
        return {}
    try:
        if not isinstance(d, dict):
            raise ValueError
        return {str(k): int(v, 16) for k, v in d.items() if isinstance(v, str) and len(v) == 16}
    except ValueError:
        raise ValueError("the snapshot's call digests are not {callId: 16 hex digits}") from None


def _b64(a: array) -> str:
    return base64.b64encode(a.tobytes()).decode("ascii")


def _unb64(typecode: str, text: str) -> array:
    out = array(typecode)
    try:
        out.frombytes(base64.b64decode(text, validate=True))
    except ValueError as exc:
        raise ValueError(f"the snapshot's call index is damaged: {exc}") from None
    return out


class ResultCache:
    """The last ``capacity`` settled results, least recently used out first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("the results cache holds at least one result")
        self.capacity = capacity
        self._items: OrderedDict[str, dict] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, call_id: str) -> bool:
        return call_id in self._items

    def get(self, call_id: str) -> dict | None:
        result = self._items.get(call_id)
        if result is not None:
            self._items.move_to_end(call_id)
        return result

    def put(self, call_id: str, result: dict) -> None:
        self._items[call_id] = result
        self._items.move_to_end(call_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)


async def _no_disk(call_id: str, seq: int) -> dict:
    raise LookupError(f"the result of call {call_id} (seq {seq}) is no longer in memory and "
                      "this table has no log reader")


class KnownCalls:
    """What a call table knows of its calls, bounded (module doc): the exact index, the
    results cache, and -- for the unsettled calls only -- their names, their logged
    ``tool/call`` events (a resume rebuilds them) and the events their waiters wait on.

    ``read_result(call_id, seq)`` reads a result that fell out of the cache back from the
    log (a worker thread; it verifies what it reads and raises ``LogCorrupt`` on damage)."""

    def __init__(self, capacity: int,
                 read_result: Callable[[str, int], Awaitable[dict]] | None = None) -> None:
        self.index = CallIndex()
        self.cache = ResultCache(capacity)
        self._read_result = read_result or _no_disk
        #: callId -> name, while the call has no result.
        self.names: dict[str, str] = {}
        #: callId -> its logged ``tool/call`` event, while it has no result.
        self.logged: dict[str, Any] = {}
        #: callId -> the event set once its result is durable (unsettled calls only).
        self.waiters: dict[str, trio.Event] = {}

    def __contains__(self, call_id: str) -> bool:
        return call_id in self.index

    def seq(self, call_id: str) -> int | None:
        """The seq of the call's ``tool/result`` (:data:`UNSETTLED`: none); None: unknown."""
        return self.index.get(call_id)

    def check_reuse(self, call_id: str, name: str, arguments: dict) -> None:
        """InvalidParams ``CALL_ID_REUSED`` when ``call_id`` is known as a call of another
        tool or other arguments (module doc)."""
        known = self.index.digest(call_id)
        if known and known != call_digest(name, arguments) \
                and known != legacy_digest(name, arguments):
            raise InvalidParams(
                f"callId {call_id!r} is already a call of this session with another command or "
                "other arguments; its result is not this request's (use a new callId)",
                field="callId", code="CALL_ID_REUSED")

    def is_settled(self, call_id: str) -> bool:
        seq = self.index.get(call_id)
        return seq is not None and seq != UNSETTLED

    def propose(self, call_id: str, name: str, digest: int = 0) -> None:
        """Known and waitable from now on (no result yet)."""
        self.index.add(call_id, digest)
        if not self.is_settled(call_id):
            self.names[call_id] = name
            self.waiters.setdefault(call_id, trio.Event())

    def called(self, call_id: str, name: str, ev: Any) -> None:
        """A logged ``tool/call`` (on open, or a resume's open call)."""
        data = ev.get("data") if isinstance(ev, dict) else None
        arguments = data.get("arguments") if isinstance(data, dict) else None
        self.propose(call_id, name, call_digest(name, arguments) if arguments is not None else 0)
        if not self.is_settled(call_id):
            self.logged[call_id] = ev

    def settled(self, call_id: str, seq: int, result: dict) -> str | None:
        """``call_id``'s ``tool/result`` is ``seq`` (appended; durable or not); its name."""
        self.index.add(call_id)
        self.index.settle(call_id, seq)
        self.cache.put(call_id, result)
        self.logged.pop(call_id, None)
        return self.names.pop(call_id, None)

    def wake(self, call_id: str) -> None:
        """The call's result is durable (or will never be): its waiters wake."""
        event = self.waiters.pop(call_id, None)
        if event is not None:
            event.set()

    def wake_all(self) -> None:
        for call_id in list(self.waiters):
            self.wake(call_id)

    def waiter(self, call_id: str) -> trio.Event:
        return self.waiters.setdefault(call_id, trio.Event())

    def cached(self, call_id: str) -> dict | None:
        return self.cache.get(call_id)

    def settled_result(self, call_id: str) -> dict | None:
        """The cached result; :data:`SETTLED_ELSEWHERE` for a settled call whose result is on
        disk only (``call_output``: a follower then reads the exit record); None: unsettled."""
        result = self.cache.get(call_id)
        if result is None and self.is_settled(call_id):
            return SETTLED_ELSEWHERE
        return result

    async def result(self, call_id: str) -> dict:
        """The settled call's result: from the cache, else read back from the log."""
        result = self.cache.get(call_id)
        if result is None:
            seq = self.index.get(call_id)
            assert seq is not None and seq != UNSETTLED
            result = await self._read_result(call_id, seq)
            self.cache.put(call_id, result)
        return result

    def statistics(self) -> dict:
        """Sizes, for the memory tests and the soak bench."""
        return {"known": len(self.index), "indexBytes": self.index.nbytes(),
                "cached": len(self.cache), "unsettled": len(self.names),
                "waiters": len(self.waiters), "logged": len(self.logged)}
