"""Live streaming end to end: real dshd, real socket, real processes (issue 2, PROTOCOL §3.3)."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from client.api import connect

LOOP = "for i in $(seq 1 200); do echo line $i; sleep 0.01; done"
EXPECTED = "".join(f"line {i}\n" for i in range(1, 201))


def _text(view: dict, call_id: str) -> str | None:
    tool = view["tools"].get(call_id)
    return None if tool is None else tool["output"]["content"][0]["text"]


def _settled(view: dict, call_id: str) -> bool:
    return any(r["callId"] == call_id for r in view["recent"])


async def _daemon_view(socket: Path, session_id: str) -> dict:
    """The daemon's lane view now: the base batch of a fresh subscription."""
    async with connect(socket, "view-probe") as c:
        sub = await c.subscribe(session_id)
        view = await sub.next_view()
        assert sub.mirror.last_ops[0][0] == "r"
        await sub.aclose()
        return view


async def test_two_clients_mirror_the_live_output(daemon, workdir):
    async with connect(daemon.socket, "a") as a, connect(daemon.socket, "b") as b, \
            connect(daemon.socket, "runner") as runner:
        sid = await runner.create_session(str(workdir), title="two clients")
        sub_a = await a.subscribe(sid)
        sub_b = await b.subscribe(sid)
        call_id = await runner.run_tool(sid, LOOP, approved=True)
        seen: dict[str, list[str]] = {"a": [], "b": []}

        async def watch(name: str, sub) -> None:
            async for view in sub:
                text = _text(view, call_id)
                if text is not None and (not seen[name] or seen[name][-1] != text):
                    seen[name].append(text)
                if _settled(view, call_id):
                    return

        async with trio.open_nursery() as n:
            n.start_soon(watch, "a", sub_a)
            n.start_soon(watch, "b", sub_b)
        result = await runner.wait(sid, call_id)
        assert result["exitCode"] == 0 and result["content"] == EXPECTED
        for name in ("a", "b"):
            states = seen[name]
            # Live: many intermediate states, each a growing prefix of the output.
            assert len(states) > 20, (name, len(states))
            for earlier, later in zip(states, states[1:]):
                assert later.startswith(earlier)
            assert states[-1] == EXPECTED
        view = await _daemon_view(daemon.socket, sid)
        assert sub_a.mirror.value == view
        assert sub_b.mirror.value == view
        assert view["recent"][0]["callId"] == call_id and view["tools"] == {}


async def test_reattach_gets_a_base_batch_and_follows_to_the_end(daemon, workdir):
    async with connect(daemon.socket, "runner") as runner:
        sid = await runner.create_session(str(workdir))
        call_id = await runner.run_tool(sid, LOOP, approved=True)
        # First attach: follow until 20 lines are in, then drop the connection mid-command.
        async with connect(daemon.socket, "first") as first:
            sub = await first.subscribe(sid)
            async for view in sub:
                text = _text(view, call_id)
                if text and text.count("\n") >= 20:
                    break
        # Re-attach: the first batch is a base batch holding the current window.
        async with connect(daemon.socket, "second") as second:
            sub = await second.subscribe(sid)
            view = await sub.next_view()
            assert sub.mirror.last_ops[0][0] == "r"
            text = _text(view, call_id)
            assert text is not None and EXPECTED.startswith(text) and text.count("\n") >= 20
            while not _settled(view, call_id):
                view = await sub.next_view()
            final = sub.mirror.value
            assert final == await _daemon_view(daemon.socket, sid)
        result = await runner.wait(sid, call_id)
        assert result["exitCode"] == 0 and result["isError"] is False
        assert result["details"]["truncation"]["totalLines"] == 200
        assert result["content"] == EXPECTED


async def test_disconnecting_client_never_stops_the_tool(daemon, workdir):
    marker = workdir / "done"
    async with connect(daemon.socket, "fire-and-leave") as c:
        sid = await c.create_session(str(workdir))
        call_id = await c.run_tool(sid, f"sleep 0.5; echo finished > {marker}", approved=True)
    async with connect(daemon.socket, "later") as c:
        result = await c.wait(sid, call_id)
    assert result["exitCode"] == 0
    assert marker.read_text() == "finished\n"


async def test_twenty_megabytes_stay_in_a_bounded_window_and_spill(daemon, workdir):
    async with connect(daemon.socket, "runner") as runner, connect(daemon.socket, "watcher") as w:
        sid = await runner.create_session(str(workdir))
        sub = await w.subscribe(sid)
        call_id = await runner.run_tool(sid, "yes | head -c 20000000", approved=True)
        max_seen = 0
        async for view in sub:
            text = _text(view, call_id)
            if text is not None:
                max_seen = max(max_seen, len(text.encode()))
            if _settled(view, call_id):
                break
        result = await runner.wait(sid, call_id)
    trunc = result["details"]["truncation"]
    assert trunc["totalBytes"] == 20_000_000 and trunc["truncated"] is True
    assert len(result["content"].encode()) <= 51_200
    assert max_seen <= 51_200
    spill = Path(result["details"]["spillPath"])
    assert spill.is_absolute() and spill.stat().st_size == 20_000_000
    assert spill.is_relative_to(daemon.state_dir)
    assert oct(spill.stat().st_mode & 0o777) == "0o600"
    peak_mib = daemon.peak_rss_kib() / 1024
    print(f"dshd peak RSS after 20 MB of output: {peak_mib:.1f} MiB")
    assert peak_mib < 150, peak_mib


async def test_many_concurrent_calls_on_one_session(daemon, workdir):
    async with connect(daemon.socket, "runner") as c:
        sid = await c.create_session(str(workdir))
        ids = [await c.run_tool(sid, f"echo call {i}; exit {i % 3}", approved=True) for i in range(12)]
        results = {}

        async def wait(cid: str) -> None:
            results[cid] = await c.wait(sid, cid)

        async with trio.open_nursery() as n:
            for cid in ids:
                n.start_soon(wait, cid)
    for i, cid in enumerate(ids):
        assert results[cid]["exitCode"] == i % 3
        assert results[cid]["content"] == f"call {i}\n"


async def test_call_id_is_an_idempotency_key(daemon, workdir):
    counter = workdir / "count"
    async with connect(daemon.socket, "runner") as c:
        sid = await c.create_session(str(workdir))
        cmd = f"echo x >> {counter}; echo $DSH_CALL_ID $DSH_SESSION_ID"
        first = await c.run_tool(sid, cmd, call_id="build-1", approved=True)
        second = await c.run_tool(sid, cmd, call_id="build-1", approved=True)
        assert first == second == "build-1"
        result = await c.wait(sid, "build-1")
    assert counter.read_text() == "x\n"
    assert result["content"] == f"build-1 {sid}\n"
    assert os.path.isdir(workdir)
