"""What confined commands see and keep: environment, hidden paths, workspace placement, network,
private temporary directories, cancellation — with real bwrap and real Landlock.

No assertion is about elapsed time: waits poll by count, and kill paths are judged by which
processes are left.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
import trio

from dshd.execution import landlock_exec
from dshd.execution.sandbox import SandboxUnavailable
from dshd.execution.sandbox_bwrap import BwrapProvider
from dshd.execution.sandbox_landlock import LandlockProvider

from .helpers import call_env, run_confined

PROVIDERS = ["bwrap", "landlock"]
MODES = ["read-only", "workspace-write"]


@pytest.fixture
def area(scratch_root: Path):
    root = scratch_root / f"area-{uuid.uuid4().hex[:8]}"
    (root / "ws").mkdir(parents=True)
    (root / "state" / "sessions" / "other").mkdir(parents=True)
    (root / "state" / "sessions" / "other" / "log.zst").write_text("SECRET\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", PROVIDERS)
async def test_call_and_session_ids_pass_through(provider_of, area, name, mode) -> None:
    env = call_env(call_id="call-42", session_id="sess-7")
    outcome, text, _ = await run_confined(
        provider_of(name), 'echo "ids=$DSH_CALL_ID/$DSH_SESSION_ID"', mode, str(area / "ws"),
        env=env,
    )
    assert outcome.exit_code == 0
    assert "ids=call-42/sess-7" in text


@pytest.mark.parametrize("mode", MODES)
async def test_bwrap_hidden_state_dir_is_empty_and_unreadable(provider_of, area, mode) -> None:
    state = area / "state"
    script = f'ls -A "{state}" | wc -l; cat "{state}/sessions/other/log.zst" || echo CAT-FAILED'
    outcome, text, completeness = await run_confined(
        provider_of("bwrap"), script, mode, str(area / "ws"), hide=[str(state)]
    )
    assert completeness == "full"
    assert text.splitlines()[0].strip() == "0"
    assert "CAT-FAILED" in text and "SECRET" not in text


async def test_landlock_cannot_hide_and_says_partial(provider_of, area) -> None:
    provider = provider_of("landlock")
    state = area / "state"
    outcome, text, completeness = await run_confined(
        provider, f'cat "{state}/sessions/other/log.zst"', "workspace-write", str(area / "ws"),
        hide=[str(state)],
    )
    assert completeness == "partial" == provider.completeness
    assert "SECRET" in text  # the documented limit…
    assert "state directory" in provider.reason  # …and the reason says so
    assert provider.describe()["completeness"] == "partial"


@pytest.mark.parametrize("name", PROVIDERS)
async def test_workspace_under_tmp_stays_visible(provider_of, name) -> None:
    """The private /tmp never hides the workspace (EXEC.md §3)."""
    root = Path(tempfile.mkdtemp(prefix="dsh-ws-under-tmp-", dir="/tmp"))
    try:
        ws, sibling = root / "ws", root / "sibling"
        ws.mkdir()
        sibling.write_text("host tmp file\n")
        (ws / "seen").write_text("workspace file\n")
        script = f'cat seen; echo new > made && echo MADE; cat "{sibling}" || echo NO-SIBLING; ' \
                 f'echo x > "{root}/escape" || echo DENIED'
        outcome, text, _ = await run_confined(provider_of(name), script, "workspace-write", str(ws))
        assert "workspace file" in text and "MADE" in text and (ws / "made").exists()
        assert not (root / "escape").exists()
        if name == "bwrap":
            assert "NO-SIBLING" in text  # the rest of the host's /tmp is not there at all
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("name", PROVIDERS)
def test_workspace_inside_a_hidden_dir_is_refused(provider_of, area, name) -> None:
    """A workspace at or inside a hidden path (the state directory) is refused by the provider
    itself, on the pinned path: the session's own check looks at the path string, which a
    rename can point elsewhere after it looked (issue 11 item 1)."""
    state = area / "state"
    ws = state / "sessions" / "mine" / "ws"
    ws.mkdir(parents=True)
    for mode in ("workspace-write", "read-only"):
        with pytest.raises(SandboxUnavailable) as info:
            provider_of(name).confine(["true"], mode, str(ws), hide=[str(state)], fds=[])
        assert str(ws) in str(info.value) and "state directory" in str(info.value)


async def test_bwrap_hides_a_socket_file(provider_of, area) -> None:
    """A non-directory in ``hide`` (the daemon's socket) gets /dev/null bound over it."""
    path = area / "ctl.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(4)
    listener.setblocking(False)
    try:
        py = shutil.which("python3") or "/usr/bin/python3"
        script = (
            f'{py} -c "import socket,sys; s=socket.socket(socket.AF_UNIX); '
            f"s.connect(sys.argv[1]); print('CONNECTED')\" \"{path}\""
        )
        _, text, _ = await run_confined(
            provider_of("bwrap"), script, "workspace-write", str(area / "ws"), hide=[str(path)]
        )
        with pytest.raises(BlockingIOError):
            listener.accept()
        assert "CONNECTED" not in text
    finally:
        listener.close()


@pytest.mark.parametrize("name", PROVIDERS)
async def test_network_flag_opens_tcp_in_workspace_write_only(provider_of, area, name) -> None:
    listener = socket.create_server(("127.0.0.1", 0), backlog=8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    script = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED"
    try:
        results = {}
        for mode in MODES:
            _, text, _ = await run_confined(
                provider_of(name), script, mode, str(area / "ws"), network=True
            )
            try:
                listener.accept()[0].close()
                results[mode] = True
            except BlockingIOError:
                results[mode] = False
            results[mode + "/said"] = "CONNECTED" in text
        assert results == {
            "read-only": False, "read-only/said": False,
            "workspace-write": True, "workspace-write/said": True,
        }
    finally:
        listener.close()


def _fd_of(argv: list[str], flag: str, dest: str) -> int:
    """The fd that ``flag FD dest`` names in a bwrap argv."""
    for i in range(len(argv) - 2):
        if argv[i] == flag and argv[i + 2] == dest:
            return int(argv[i + 1])
    raise AssertionError(f"no {flag} FD {dest} in {argv}")


def test_bwrap_argv_shape(tmp_path) -> None:
    from dshd.execution.sandbox import close_fds

    provider = BwrapProvider("/usr/bin/bwrap", disable_userns=True)
    real = tmp_path / "ws"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    fds: list[int] = []
    # A path that leads elsewhere than itself (a symlink on the way) is refused: pinning what
    # it leads to now would pin whatever a rename put there (issue 11 item 1).
    with pytest.raises(SandboxUnavailable, match="is not where it was"):
        provider.confine(["x"], "workspace-write", str(link), fds=fds)
    assert fds == []
    argv, completeness = provider.confine(
        ["echo", "hi"], "workspace-write", str(real), hide=["/etc/passwd", "/var"],
        network=True, fds=fds,
    )
    try:
        assert completeness == "full"
        head = argv[: argv.index("--ro-bind")]
        assert head == [
            "/usr/bin/bwrap", "--unshare-all", "--share-net", "--unshare-user",
            "--disable-userns", "--cap-drop", "ALL", "--die-with-parent",
        ]
        joined = " ".join(argv)
        # The workspace is bound from its pinned fd (never by name) at the fd's own path.
        fd = _fd_of(argv, "--bind-fd", str(real))
        assert fds == [fd] and os.path.samestat(os.fstat(fd), os.stat(real))
        assert f" {link} " not in joined and "--bind " not in joined
        # parents first: / then /tmp's tmpfs, then the workspace bound over it
        assert joined.index("--ro-bind / /") < joined.index("--tmpfs /tmp") < joined.index(
            f"--bind-fd {fd} {real}")
        assert f"--size {provider.tmp_size} --tmpfs /tmp " in joined
        assert "--tmpfs /var" in joined and "--remount-ro /var" in joined
        assert "--ro-bind /dev/null /etc/passwd" in joined
        assert argv[-5:] == ["--chdir", str(real), "--", "echo", "hi"]
    finally:
        close_fds(fds)
    ro, _ = provider.confine(["true"], "read-only", str(real), network=True, fds=fds)
    assert "--share-net" not in ro and f"--ro-bind-fd {fds[0]} {real}" in " ".join(ro)
    close_fds(fds)
    assert provider.confine(["x"], "danger-full-access", "/tmp") == (["x"], "none")
    with pytest.raises(ValueError):
        provider.confine(["x"], "full-access", "/tmp", fds=fds)
    with pytest.raises(ValueError):
        provider.confine(["x"], "read-only", "relative/dir", fds=fds)
    with pytest.raises(ValueError):
        provider.confine(["x"], "read-only", str(real), hide=["/"], fds=fds)
    with pytest.raises(ValueError, match="fds"):  # without fds there is no way to pass the pin
        provider.confine(["x"], "read-only", str(real))
    with pytest.raises(SandboxUnavailable):  # the private /tmp itself is no workspace
        provider.confine(["x"], "read-only", "/tmp", fds=fds)
    with pytest.raises(SandboxUnavailable, match="cannot be opened"):
        provider.confine(["x"], "read-only", str(tmp_path / "missing"), fds=fds)
    assert fds == []  # a refusal leaves nothing open


def test_landlock_argv_shape(tmp_path) -> None:
    provider = LandlockProvider(7, "/py", "/l.py", "/scratch/landlock-tmp")
    real = tmp_path / "work"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    st = os.stat(real)
    with pytest.raises(SandboxUnavailable, match="is not where it was"):
        provider.confine(["ls"], "workspace-write", str(tmp_path / "link"))
    argv, completeness = provider.confine(["ls"], "workspace-write", str(real), network=True)
    assert completeness == "partial"
    assert argv[:4] == ["/py", "-I", "-S", "/l.py"] and argv[-2:] == ["--", "ls"]
    rules = json.loads(argv[argv.index("--rules-json") + 1])
    assert rules["write"] == [] and rules["deny_tcp"] is False
    # The pinned path and its identity: the launcher checks its own open against them.
    assert rules["workspace"] == {"path": str(real), "dev": st.st_dev, "ino": st.st_ino,
                                  "write": True}
    argv, _ = provider.confine(["ls"], "read-only", str(real), network=True)
    rules = json.loads(argv[argv.index("--rules-json") + 1])
    assert rules["write"] == [] and rules["deny_tcp"] is True and rules["read"] == ["/"]
    assert rules["workspace"]["write"] is False
    assert provider.confine(["ls"], "danger-full-access", "/work") == (["ls"], "none")


@pytest.mark.parametrize("rules", ['{"write": ["/nonexistent/ws"]}', "not json"])
def test_landlock_launcher_fails_closed(area, rules) -> None:
    """A launcher that cannot apply its rules never runs the command."""
    marker = area / "ran"
    result = subprocess.run(
        [shutil.which("python3") or "/usr/bin/python3", "-I", "-S", landlock_exec.__file__,
         "--rules-json", rules, "--", "touch", str(marker)],
        capture_output=True, text=True,
    )
    assert result.returncode == landlock_exec.EXIT_SETUP_FAILED
    assert "the command was not run" in result.stderr
    assert not marker.exists()


async def test_landlock_private_tmpdirs_are_collected(provider_of, area) -> None:
    provider = provider_of("landlock")
    first_outcome, first, _ = await run_confined(
        provider, 'echo "T=$TMPDIR"; echo x > "$TMPDIR/f"', "read-only", str(area / "ws")
    )
    first_tmp = Path(first.split("T=", 1)[1].split()[0])
    assert first_outcome.exit_code == 0 and first_tmp.parent == Path(provider.tmp_root)
    assert first_tmp.exists()  # nothing removes it while its call could still be running…
    _, second, _ = await run_confined(provider, 'echo "T=$TMPDIR"', "read-only", str(area / "ws"))
    second_tmp = Path(second.split("T=", 1)[1].split()[0])
    assert second_tmp != first_tmp
    assert not first_tmp.exists()  # …and the next launch collects it once its group is gone


def _sleepers(marker: str) -> list[int]:
    """Live (non-zombie) ``sleep 100`` processes whose environment carries ``marker``."""
    found = []
    needle = f"DSH_CALL_ID={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if os.path.basename(argv[0]) != b"sleep" or argv[1:2] != [b"100"]:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


@pytest.mark.parametrize(
    "name,script,count",
    [
        # bwrap: even a setsid'd process (outside the group) dies with the pid namespace
        ("bwrap", "sleep 100 & setsid sleep 100 & sleep 100", 3),
        ("landlock", "sleep 100 & sleep 100", 2),
    ],
)
async def test_cancel_takes_the_sandbox_down(provider_of, area, name, script, count) -> None:
    provider = provider_of(name)
    marker = f"cancel-{uuid.uuid4().hex[:10]}"
    cancel = trio.Event()
    outcome = None

    async def call() -> None:
        nonlocal outcome
        outcome, _, _ = await run_confined(
            provider, script, "workspace-write", str(area / "ws"),
            env=call_env(call_id=marker), cancel=cancel,
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        for _ in range(2000):  # poll by count until every sleeper is up
            if len(_sleepers(marker)) >= count:
                break
            await trio.sleep(0.005)
        assert len(_sleepers(marker)) >= count
        cancel.set()
    assert outcome is not None and outcome.cancelled
    for _ in range(1000):
        if not _sleepers(marker):
            break
        await trio.sleep(0.005)
    left = _sleepers(marker)
    for pid in left:  # do not leak them into the rest of the run
        os.kill(pid, 9)
    assert left == []


async def test_bwrap_private_run_keeps_what_tools_need(provider_of, area) -> None:
    """/run is private (no host sockets), yet /run/lock exists and resolv.conf still reads."""
    script = 'ls -A /run | sed s/^/RUN:/; test -d /run/lock && echo LOCK-OK; ' \
             'cat /etc/resolv.conf > /dev/null && echo RESOLV-OK'
    outcome, text, _ = await run_confined(
        provider_of("bwrap"), script, "read-only", str(area / "ws")
    )
    listed = {line[4:] for line in text.splitlines() if line.startswith("RUN:")}
    expected = {"lock"}
    if os.path.islink("/run/shm"):
        expected.add("shm")
    resolv = Path(os.path.realpath("/etc/resolv.conf"))
    if resolv.parts[1] == "run":
        expected.add(resolv.parts[2])  # e.g. systemd/ holding only resolve/
    assert listed == expected, text
    assert "LOCK-OK" in text and "RESOLV-OK" in text


REFUSED_WORKSPACES = ["/", "/proc", "/proc/sys", "/sys", "/dev", "/run", "/tmp", "/etc", "/usr"]


@pytest.mark.parametrize("name", ["bwrap", "landlock"])
@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
async def test_system_directories_are_never_confined_as_a_workspace(provider_of, name, mode):
    """Issue 10 item 4 (a session recorded before session.create refused them): the workspace
    bind at /proc covered the sandbox's own procfs with the host's, read-write. The same value
    is written back, so even a failing run changes nothing on the host."""
    provider = provider_of(name)
    target = "/proc/sys/kernel/printk_ratelimit"
    value = Path(target).read_text().strip()
    for workspace in REFUSED_WORKSPACES:
        with pytest.raises(SandboxUnavailable, match="cannot be a session directory"):
            await run_confined(provider, f"echo {value} > {target} && echo WROTE", mode,
                               workspace)
    assert provider.confine(["true"], "danger-full-access", "/proc") == (["true"], "none")


def test_bwrap_mounts_its_own_trees_last_and_pins_mask_parents(tmp_path) -> None:
    """Nothing is mounted over the sandbox's /proc, /dev, /tmp, /run after they are made; each
    directory between the workspace and a mask inside it is bound onto itself (so it cannot be
    renamed away from under the mask), from an fd opened below the workspace's fd."""
    from dshd.execution.sandbox import close_fds

    ws = tmp_path / "home"
    state = ws / ".local" / "state" / "dsh"
    state.mkdir(parents=True)
    provider = BwrapProvider("/usr/bin/bwrap")
    fds: list[int] = []
    argv, _ = provider.confine(["true"], "workspace-write", str(ws), hide=[str(state)], fds=fds)
    joined = " ".join(argv)
    for parent in (ws / ".local", ws / ".local" / "state"):
        fd = _fd_of(argv, "--bind-fd", str(parent))
        assert fd in fds and os.path.samestat(os.fstat(fd), os.stat(parent))
    ws_fd = _fd_of(argv, "--bind-fd", str(ws))
    assert joined.index(f"--bind-fd {ws_fd} {ws} ") < joined.index(f"{ws}/.local ")
    assert argv.index(f"{ws}/.local/state") < joined.split().index(str(state))
    assert argv[argv.index("--chdir") - 4:argv.index("--chdir")] == [
        "--remount-ro", "/dev", "--remount-ro", "/proc"]
    close_fds(fds)
    ro, _ = provider.confine(["true"], "read-only", str(ws), hide=[str(state)], fds=fds)
    _fd_of(ro, "--ro-bind-fd", f"{ws}/.local")
    close_fds(fds)


def test_tmp_budget_counts_locked_leases_only(tmp_path) -> None:
    """The sum bound of issue 10 item 6, without a daemon: a lease counts while any process
    holds its fd (the daemon until the spawn, then the sandbox), from the moment it is
    reserved — there is no state in which a live lease looks unlocked (issue 11 item 3)."""
    from dshd.execution.sandbox import TmpBudget

    budget = TmpBudget(str(tmp_path / "leases"), per_call=10, total=25)
    first, second = budget.reserve(), budget.reserve()
    assert budget.in_use() == 2  # held by this process's reservations: counted
    with pytest.raises(SandboxUnavailable, match="tmp_total_bytes"):
        budget.reserve()
    holder = subprocess.Popen(  # another process inherits the first lease, as bwrap does
        [shutil.which("python3"), "-c", "import sys; print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, pass_fds=(first,))
    try:
        assert holder.stdout.readline() == "held\n"
        os.close(first)  # the daemon's copy, closed after the spawn
        os.close(second)  # a reservation whose spawn never happened
        assert budget.in_use() == 1
        third = budget.reserve()
        with pytest.raises(SandboxUnavailable):
            budget.reserve()
    finally:
        holder.stdin.close()
        holder.wait()
    assert budget.in_use() == 1  # the first ended with its holder: removed; third still held
    os.close(third)
    assert budget.in_use() == 0 and os.listdir(tmp_path / "leases") == []
