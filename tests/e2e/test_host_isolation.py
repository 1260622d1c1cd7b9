"""A sandboxed command cannot reach any call host's control socket (HOST.md §4), even with
``network = true``, where bwrap shares the network namespace: an abstract socket was visible
and reachable there (a command that flooded every host's connection slots made other
sessions' calls fail). The socket is a file in the masked state directory now."""

from __future__ import annotations

import json
import time

import pytest

from .spawn_rpc import Daemon

PROBE = r'''
import os, socket
names = set()
for line in open("/proc/net/unix").read().splitlines()[1:]:
    parts = line.split()
    if len(parts) >= 8 and "control.sock" in parts[-1]:
        names.add(parts[-1])
names.add(os.environ["TARGET"])
if os.environ["CONTROL"] != "control.sock":  # the neighbour's abstract name (the old design)
    names.add("\0" + os.environ["CONTROL"])
reached = 0
for name in sorted(names):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(name)
        reached += 1
        print("REACHED", repr(name))
    except OSError as exc:
        pass
    finally:
        s.close()
print("tried", len(names), "reached", reached)
'''


@pytest.mark.parametrize("network", [True, False])
def test_no_sandboxed_command_reaches_a_call_host(network, workdir):
    config = f"network = {'true' if network else 'false'}\n"
    with Daemon(config) as d:
        rpc = d.rpc()
        sid = rpc.session(workdir)
        # A neighbour call whose host the probe will look for.
        neighbour_sid = rpc.session(workdir)
        neighbour = rpc.start(neighbour_sid, "sleep 60")
        call_dir = d.state_dir / "sessions" / neighbour_sid / "calls" / neighbour
        deadline = time.monotonic() + 60
        while not (call_dir / "host.json").exists():
            assert time.monotonic() < deadline, "the neighbour's host did not start"
            time.sleep(0.05)
        control = json.loads((call_dir / "host.json").read_text())["control"]
        (workdir / "probe.py").write_text(PROBE)
        result = rpc.run(sid, f"TARGET={json.dumps(str(call_dir / 'control.sock'))} "
                              f"CONTROL={json.dumps(control)} python3 probe.py")
        text = result["content"]
        assert "tried" in text, result
        assert "REACHED" not in text and text.rstrip().endswith("reached 0"), text
        assert rpc.call("tool.cancel", {"sessionId": neighbour_sid, "callId": neighbour})


def test_a_killed_host_leaves_nothing_of_its_command_running(workdir):
    """kill -9 of a call's host: the call settles TOOL_FAILED at once, and its command's
    processes -- a setsid child re-parented to pid 1 included -- are killed by the run's token
    (before: the setsid child ran on, owned by nobody)."""
    import os
    import signal
    import time

    from .conftest import live_processes_matching

    tag = f"dsh-hostkill-{os.getpid()}-{time.monotonic_ns()}"
    with Daemon() as d:
        rpc = d.rpc()
        sid = rpc.session(workdir, sandbox="danger-full-access")
        cid = rpc.start(sid, f"setsid sh -c 'sleep 501; :' {tag} & echo ready; "
                             "while :; do sleep 0.2; done")
        host_json = d.state_dir / "sessions" / sid / "calls" / cid / "host.json"
        deadline = time.monotonic() + 60
        while not (host_json.exists() and live_processes_matching(tag)):
            assert time.monotonic() < deadline, "the call did not start"
            time.sleep(0.05)
        os.kill(json.loads(host_json.read_text())["pid"], signal.SIGKILL)
        result = rpc.wait(sid, cid)
        assert result["isError"] and result["errorCode"] == "TOOL_FAILED", result
        assert "died" in result["message"], result
        deadline = time.monotonic() + 10
        while live_processes_matching(tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = live_processes_matching(tag)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert left == [], f"the setsid child outlived its killed host: {left}"
