""""Print only what is new": Follower (windows, overlaps, totals) and CallOutput (lane ops)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from client.follow import CallOutput, Follower, overlaps, text_path
from protocol.mirror import Mirror


def utf8(s: str) -> int:
    return len(s.encode("utf-8"))


# ---------------------------------------------------------------------- overlaps
@given(st.text(alphabet="ab", max_size=12), st.text(alphabet="ab", max_size=12))
def test_overlaps_matches_brute_force(prev, new):
    expected = [k for k in range(min(len(prev), len(new)), -1, -1) if prev.endswith(new[:k])]
    if not prev:
        expected = [0]
    assert overlaps(prev, new) == expected


def test_overlaps_is_linear_on_repetitive_text():
    prev = "y\n" * 25_000
    cands = overlaps(prev, prev)
    assert cands[0] == len(prev) and cands[-1] == 0 and len(cands) == 25_001


# ---------------------------------------------------------------------- Follower
def test_append_and_slide_print_exactly_the_appends():
    f = Follower()
    assert f.resync("") == ""
    assert f.append("hello ") == "hello "
    assert f.drop(3) == ""
    assert f.append("world") == "world"
    assert f.window == "lo world"


def test_resync_prints_only_the_unprinted_suffix():
    f = Follower()
    assert f.resync("line1\nline2\n") == "line1\nline2\n"
    # The window slid by one line and grew by one: only the new line is new.
    assert f.resync("line2\nline3\n") == "line3\n"
    # The same window again: nothing is new.
    assert f.resync("line2\nline3\n") == ""


def test_totals_disambiguate_repetitive_output():
    f = Follower()
    assert f.resync("y\ny\n", total_bytes=4) == "y\ny\n"
    # Text alone cannot tell: with totals, 4 more bytes were written.
    assert f.resync("y\ny\n", total_bytes=8) == "y\ny\n"
    assert f.resync("y\ny\n", total_bytes=10) == "y\n"
    # Without totals the longest overlap wins: nothing is printed twice.
    g = Follower()
    g.resync("y\ny\n")
    assert g.resync("y\ny\n") == ""


def test_lost_text_is_not_invented():
    f = Follower()
    f.resync("abc", total_bytes=3)
    assert f.resync("xyz", total_bytes=100) == "xyz"


@st.composite
def stream_scenarios(draw):
    """A full output and a walk of windows over it that never loses unprinted text.

    Steps: ("append", chunk) / ("slide", n, chunk) inside one subscription (the ops), or
    ("resync", start, grow) -- a new base whose window starts at most at what was printed.
    """
    alphabet = draw(st.sampled_from(["ab", "a\n", "xyz\n", None]))
    chunk = st.text(alphabet=alphabet, max_size=8) if alphabet else st.text(max_size=8)
    steps = draw(st.lists(st.tuples(st.sampled_from(["append", "slide", "resync"]),
                                    st.integers(0, 12), chunk), max_size=30))
    return steps


def _replay(steps, *, totals: bool):
    """Drive a Follower like the lane would; return (printed pieces, full output, follower)."""
    output = ""
    start = 0  # window = output[start:]
    f = Follower()
    pieces = [f.resync("", total_bytes=0 if totals else None)]
    for kind, n, chunk in steps:
        if kind == "append":
            output += chunk
            pieces.append(f.append(chunk))
        elif kind == "slide":
            n = min(n, len(output) - start)
            start += n
            output += chunk
            pieces.append(f.drop(n))
            pieces.append(f.append(chunk))
        else:  # a resubscribe: the window moves anywhere that keeps the unprinted text
            output += chunk
            start = min(start + n, len(output) - len(chunk))  # printed up to len(output)-len(chunk)
            pieces.append(f.resync(output[start:], total_bytes=utf8(output) if totals else None))
        if totals:
            f.note_total(utf8(output))
        assert f.window == output[start:]
    return pieces, output, f


@settings(max_examples=300, deadline=None)
@given(stream_scenarios())
def test_printed_pieces_concatenate_to_the_full_output_with_totals(steps):
    pieces, output, f = _replay(steps, totals=True)
    assert "".join(pieces) == output


@settings(max_examples=300, deadline=None)
@given(stream_scenarios())
def test_without_totals_nothing_is_printed_twice(steps):
    pieces, output, f = _replay(steps, totals=False)
    printed = "".join(pieces)
    assert len(printed) <= len(output)
    assert printed.endswith(f.window)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.characters(), unique=True, max_size=60).map("".join),
       st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=12))
def test_without_totals_unambiguous_output_is_exact(text, moves):
    """Distinct characters: the text overlap alone is unambiguous, so resync is exact."""
    f = Follower()
    pieces = []
    start = end = 0
    for advance, grow in moves:
        start = min(start + advance, end)  # never past what was printed
        end = min(end + grow, len(text))
        pieces.append(f.resync(text[start:end]))
    assert "".join(pieces) == text[:end]


# ---------------------------------------------------------------------- CallOutput
def _tool(text: str, total: int, truncated: bool = False) -> dict:
    return {
        "name": "bash",
        "args": {"command": "x"},
        "state": "running",
        "startedAt": 1,
        "output": {
            "content": [{"type": "text", "text": text}],
            "details": {},
            "truncation": {"truncated": truncated, "truncatedBy": "bytes" if truncated else None,
                           "totalBytes": total,
                           "totalLines": 0, "maxBytes": 51200, "maxLines": 2000},
        },
    }


LANE = {"session": {"sessionId": "s"}, "tools": {}, "approvals": {}, "recent": [], "turn": None}
TEXT = list(text_path("c1"))
TOTAL = ["tools", "c1", "output", "truncation", "totalBytes"]
TRUNCATED = ["tools", "c1", "output", "truncation", "truncated"]


def _drive(batches):
    m, w, out = Mirror(), CallOutput("c1"), []
    for seq, ops in enumerate(batches):
        m.feed(seq, ops)
        out.append(w.update(m.last_ops, m.value))
    return w, "".join(out)


def test_call_output_follows_appends_and_slides_exactly():
    batches = [
        [["r", LANE]],
        [["s", ["tools", "c1"], _tool("", 0)]],
        [["a", TEXT, "ab\n"], ["s", TOTAL, 3]],
        [["a", TEXT, "ab\n"], ["s", TOTAL, 6]],
        [["t", TEXT, 3], ["a", TEXT, "ab\n"], ["s", TOTAL, 9],          # slide; repetitive
         ["s", TRUNCATED, True]],
        [["a", TEXT, "end"], ["p", ["recent"], 0, 0, [{"callId": "c1", "exitCode": 0}]],
         ["d", ["tools", "c1"]]],
    ]
    w, printed = _drive(batches)
    assert printed == "ab\nab\nab\nend"
    assert w.settled
    assert w.finish("ab\nab\nend") == ""


def test_call_output_after_resubscribe_prints_only_what_is_new():
    m, w = Mirror(), CallOutput("c1")
    m.feed(0, [["r", dict(LANE, tools={"c1": _tool("one\ntwo\n", 8)})]])
    assert w.update(m.last_ops, m.value) == "one\ntwo\n"
    # A resubscribe: a new stream, whose base shows the window slid and grown.
    m.reset()
    m.feed(0, [["r", dict(LANE, tools={"c1": _tool("two\nthree\n", 14, truncated=True)})]])
    assert w.update(m.last_ops, m.value) == "three\n"
    # Then the call settles in a new base: not in sync; the final result gives the tail.
    m.reset()
    m.feed(0, [["r", dict(LANE, recent=[{"callId": "c1", "exitCode": 0}])]])
    assert w.update(m.last_ops, m.value) == ""
    assert w.settled
    assert w.finish("three\nfour\n", 19) == "four\n"


def test_call_output_replaced_text_resyncs():
    batches = [
        [["r", dict(LANE, tools={"c1": _tool("abc", 3)})]],
        [["s", TEXT, "cdef"], ["s", TOTAL, 6], ["s", TRUNCATED, True]],  # an s on the text
        [["s", ["tools", "c1", "output"], _tool("efgh", 8, True)["output"]]],  # its parent
    ]
    w, printed = _drive(batches)
    assert printed == "abcdefgh"
    assert w.running and not w.settled


def test_call_output_ignores_other_calls_and_waits_for_its_own():
    other = ["tools", "c2", "output", "content", 0, "text"]
    batches = [
        [["r", dict(LANE, tools={"c2": _tool("", 0)})]],
        [["a", other, "not mine"]],
        [["s", ["tools", "c1"], _tool("mine", 4)]],
    ]
    w, printed = _drive(batches)
    assert printed == "mine"


def test_call_that_settled_before_it_was_seen_is_settled_via_recent():
    m, w = Mirror(), CallOutput("c1")
    m.feed(0, [["r", dict(LANE, recent=[{"callId": "c1", "exitCode": 2}])]])
    assert w.update(m.last_ops, m.value) == ""
    assert w.settled
    assert w.finish("all of it\n") == "all of it\n"


# "a\0" then "\0\0\xff\xfea\0\0\0": 8 raw bytes since "a" that clean to 7 ("\ufffd\ufffda"),
# while the whole window is 8 -- a fit the totals would believe. The window is complete.
CLEANED = "a\ufffd\ufffda"


def test_a_complete_window_is_not_reprinted_when_cleaning_fits_the_totals():
    batches = [
        [["r", dict(LANE, tools={"c1": _tool("a", 2)})]],
        [["a", TEXT, CLEANED[1:]], ["s", TOTAL, 10]],
    ]
    w, printed = _drive(batches)
    assert printed == CLEANED
    assert w.finish(CLEANED, 10, truncated=False) == ""


def test_a_complete_result_is_not_reprinted_when_cleaning_fits_the_totals():
    m, w = Mirror(), CallOutput("c1")
    m.feed(0, [["r", dict(LANE, tools={"c1": _tool("a", 2)})]])
    assert w.update(m.last_ops, m.value) == "a"
    # The call leaves the lane in the flush of its last output: the result has the rest.
    m.feed(1, [["p", ["recent"], 0, 0, [{"callId": "c1", "exitCode": 0}]],
               ["d", ["tools", "c1"]]])
    assert w.update(m.last_ops, m.value) == "" and w.settled
    assert w.finish(CLEANED, 10, truncated=False) == CLEANED[1:]
    assert w.printed_bytes == len(CLEANED.encode())


def test_a_complete_base_after_a_resubscribe_prints_only_its_rest():
    m, w = Mirror(), CallOutput("c1")
    m.feed(0, [["r", dict(LANE, tools={"c1": _tool("a", 2)})]])
    assert w.update(m.last_ops, m.value) == "a"
    m.reset()
    m.feed(0, [["r", dict(LANE, tools={"c1": _tool(CLEANED, 10)})]])
    assert w.update(m.last_ops, m.value) == CLEANED[1:]


def test_a_cut_window_still_goes_by_the_totals():
    f = Follower()
    assert f.resync("y\ny\n", total_bytes=4, complete=True) == "y\ny\n"
    assert f.resync("y\ny\n", total_bytes=6) == "y\n"  # slid: the totals tell
    assert f.resync("y\ny\nz", total_bytes=7, complete=True) == "z"


# ---------------------------------------------------------------------- through the real producer
WINDOW = 12


@st.composite
def producer_runs(draw):
    alphabet = draw(st.sampled_from(["ab\n", "a", "é€\n", "xyz\n"]))
    step = st.one_of(
        st.tuples(st.just("write"), st.text(alphabet=alphabet, min_size=1, max_size=WINDOW)),
        st.tuples(st.just("flush"), st.just("")),
        st.tuples(st.just("resubscribe"), st.just("")),
    )
    return draw(st.lists(step, max_size=40))


@settings(max_examples=400, deadline=None)
@given(producer_runs())
def test_call_output_through_tracker_encoder_and_mirror_prints_everything_once(steps):
    """The daemon's Tracker diffs a rolling window (tail retention) with totals; the client
    mirrors it and prints. Whatever the slides, flushes and resubscribes, the printed pieces
    are the full output -- as long as no flush lets the window lose unprinted text."""
    from protocol.codec import Encoder
    from protocol.tracker import Tracker

    lane = {"session": {}, "tools": {"c1": _tool("", 0)}, "approvals": {}, "recent": [],
            "turn": None}
    tracker, encoder, mirror = Tracker(lane), Encoder(), Mirror()
    watcher, printed = CallOutput("c1"), []
    state = {"full": "", "unflushed": 0, "seq": 0}

    def flush():
        ops = tracker.flush()
        state["unflushed"] = 0
        if not ops:
            return
        mirror.feed(state["seq"], encoder.encode(ops))
        state["seq"] += 1
        printed.append(watcher.update(mirror.last_ops, mirror.value))

    flush()
    for kind, chunk in steps:
        if kind == "write":
            if state["unflushed"] + len(chunk) > WINDOW:
                flush()  # else the window would drop text nobody saw
            state["full"] += chunk
            state["unflushed"] += len(chunk)
            tracker.set_text(TEXT, state["full"][-WINDOW:])
            tracker.set(TOTAL, utf8(state["full"]))
            tracker.set(TRUNCATED, len(state["full"]) > WINDOW)  # with the slide, as dshd does
        elif kind == "flush":
            flush()
        else:  # a resubscribe: a new stream, a fresh encoder and mirror state, a base batch
            tracker.rebase()
            encoder = Encoder()
            mirror.reset()
            state["seq"] = 0
            flush()
    flush()
    tracker.push(["recent"], {"callId": "c1", "exitCode": 0})
    tracker.delete(["tools", "c1"])
    flush()
    assert watcher.settled
    full = state["full"]
    tail = watcher.finish(full[-WINDOW:], utf8(full), len(full) > WINDOW)
    assert "".join(printed) + tail == full
    assert watcher.printed_bytes == utf8(full)


def test_identical_slide_is_invisible_to_ops_but_not_to_totals():
    from protocol.codec import Encoder
    from protocol.tracker import Tracker

    tracker = Tracker(dict(LANE, tools={"c1": _tool("ab\nab\n", 6)}))
    encoder, mirror, watcher = Encoder(), Mirror(), CallOutput("c1")
    mirror.feed(0, encoder.encode(tracker.flush()))
    assert watcher.update(mirror.last_ops, mirror.value) == "ab\nab\n"
    tracker.set_text(TEXT, "ab\nab\n")      # slid by "ab\n", appended "ab\n": same text
    tracker.set(TOTAL, 9)
    tracker.set(TRUNCATED, True)
    ops = tracker.flush()
    assert [op for op in ops if op[1] == TEXT] == []  # no text op at all
    mirror.feed(1, encoder.encode(ops))
    assert watcher.update(mirror.last_ops, mirror.value) == "ab\n"
