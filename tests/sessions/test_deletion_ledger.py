"""The deleted-ids ledger (``dshd.sessions.deletion.Deletions``) on real files: an id in it,
or with a directory or tombstone, is taken; a torn last line never swallows the next id."""

from __future__ import annotations

from dshd.sessions.deletion import LEDGER_NAME, Deletions
from dshd.sessions.registry import mint_session_id


def test_a_torn_last_line_does_not_swallow_the_next_id(tmp_path):
    (tmp_path / "sessions").mkdir()
    (tmp_path / LEDGER_NAME).write_bytes(b"aaaaaaaaaaaa\nmx5a")  # a crash mid-append
    d = Deletions(tmp_path)
    d._remember("bbbbbbbbbbbb")
    again = Deletions(tmp_path)
    assert again.taken("bbbbbbbbbbbb") and again.taken("aaaaaaaaaaaa")


def test_mint_never_returns_a_taken_id(tmp_path):
    (tmp_path / "sessions" / "livelivelive").mkdir(parents=True)
    (tmp_path / "sessions" / ".deleting-tombtombtomb").mkdir()
    d = Deletions(tmp_path)
    d._remember("gonegonegone")
    for first in ("gonegonegone", "livelivelive", "tombtombtomb"):
        minted = mint_session_id(d.taken, first)
        assert minted != first and len(minted) == 12 and not d.taken(minted)
    assert mint_session_id(d.taken, "freefreefree") == "freefreefree"
