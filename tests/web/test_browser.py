"""The page in a real headless Chromium (issue 16 "Must show"), against a real dshd (scripted
model), a real ``dsh web`` bridge and the real ``dsh`` CLI.

The steps share one daemon, one bridge, one browser and one session (named ``web``) and run in
file order; each saves a screenshot (browser_support.Shots prints the directory). Waits are
generous liveness bounds, never speed assertions; where the issue says "within 1 s" the
measured delay is printed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from tests.web.browser_support import (LaneWatcher, artifacts_dir, browser_world, chrome,
                                       chromium_missing, console, dshd_call, page_fixtures,
                                       until)

_missing = chromium_missing()
pytestmark = pytest.mark.skipif(_missing is not None, reason=f"browser tests: {_missing}")

LIVE_S = 5.0  # the liveness bound of "appears with live output within 1 s"
WAIT_S = 20.0
SESSION = "web"
MODEL_COMMAND = "echo model-ran >> model.txt; echo ran-by-the-model"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """dshd (scripted model), its bridge, a work directory and the screenshots."""
    with browser_world("dsh-webp", MODEL_COMMAND, artifacts_dir(tmp_path_factory)) as world:
        yield world


driver, page_console = page_fixtures()


def dsh(world, *args: str, **kw) -> subprocess.Popen:
    """The real ``dsh`` CLI on the test's daemon, in the work directory."""
    return subprocess.Popen([sys.executable, "-m", "client.cli", *args], cwd=world["work"],
                            env=dict(world["daemon"].env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def session_id(world) -> str:
    found = dshd_call(world["daemon"].socket, "session.find", {"ref": SESSION})
    return found["sessionId"]


def q(driver, css: str):
    return driver.find_elements("css selector", css)


def text_of(node) -> str:
    return node.get_attribute("textContent") or ""


def status(driver) -> str:
    nodes = q(driver, "[data-testid=conn-status]")
    return text_of(nodes[0]) if nodes else ""


def output_of(driver, call_id: str) -> str | None:
    """The rendered output of a call, running or settled (None while it is not shown)."""
    nodes = q(driver, f"[data-call-id='{call_id}'] [data-testid=call-output]")
    return text_of(nodes[0]) if nodes else None


def settled(driver, call_id: str):
    return q(driver, f"[data-testid=recent-result][data-call-id='{call_id}']")


def select_session(driver, sid: str) -> None:
    row = until(lambda: q(driver, f"[data-testid=session-row][data-session-id='{sid}']"),
                WAIT_S, what=f"session row {sid}")[0]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", row)
    row.click()
    until(lambda: driver.execute_script("return window.dshMirror()"), WAIT_S,
          what="the session's mirror")


def calls_in_mirror(driver) -> dict:
    return (driver.execute_script("return window.dshMirror()") or {}).get("tools", {})


def test_01_the_tokened_url_opens_the_page(world, driver):
    driver.get(world["bridge"].url)
    until(lambda: status(driver) == "connected", WAIT_S, what="connected")
    assert "?token=" not in driver.current_url  # exchanged for the cookie
    assert "token=" not in driver.current_url  # the fragment's token moved to localStorage
    stored = driver.execute_script("return localStorage.getItem('dsh-web-token')")
    assert stored == world["bridge"].token
    assert q(driver, "[data-testid=session-list]")
    assert "Content Security Policy" not in console(driver)  # the page works under the CSP
    world["shots"].take(driver, "connected")


def test_02_a_cli_run_appears_with_live_output(world, driver):
    """The command prints a line stamped with the time, then waits for a file the test
    makes: the page must show the line while the call still runs (the delay from the print
    to the page is printed: the issue's "within 1 s"; the bound asserted is LIVE_S)."""
    proc = dsh(world, "run", "--name", SESSION, "--", "sh", "-c",
               "printf 'first \\033[32mgreen\\033[0m line at %s\\n' \"$(date +%s.%N)\"; "
               "while [ ! -e release ]; do sleep 0.05; done; echo \"second line at $(date +%s.%N)\"")
    try:
        sid = until(lambda: _find(world), WAIT_S, what="the CLI's session")
        select_session(driver, sid)
        call = until(lambda: [c for c in q(driver, "[data-testid=call]")
                              if "first green line" in text_of(c)], LIVE_S,
                     what="the first line in the page")[0]
        shown = time.time()
        call_id = call.get_attribute("data-call-id")
        assert _call_ids(world, sid) == [call_id]
        printed = float(re.search(r"line at (\d+\.\d+)", output_of(driver, call_id)).group(1))
        print(f"\nfirst line (a new session: list poll, subscribe, follow) shown "
              f"{shown - printed:.3f} s after the command printed it", flush=True)
        assert call.get_attribute("data-state") == "running" and proc.poll() is None
        assert q(driver, f"[data-call-id='{call_id}'] .ansi-fg-2")  # the colour, as a span
        world["shots"].take(driver, "cli-run-live")
        (world["work"] / "release").touch()
        until(lambda: "second line" in (output_of(driver, call_id) or ""), LIVE_S)
        shown = time.time()
        printed = float(re.search(r"second line at (\d+\.\d+)", output_of(driver, call_id)).group(1))
        print(f"second line (the session shown) {shown - printed:.3f} s after it was printed "
              "(page polled every 0.05 s)", flush=True)
        assert proc.wait(WAIT_S) == 0, proc.stderr.read()
        until(lambda: settled(driver, call_id), WAIT_S, what="the settled result")
        assert text_of(settled(driver, call_id)[0].find_element(
            "css selector", ".call-exit")) == "exit 0"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _find(world):
    try:
        return session_id(world)
    except Exception:  # noqa: BLE001 - not made yet
        return None


def test_03_a_command_typed_in_the_page_matches_tool_wait(world, driver):
    sid = session_id(world)
    before = set(_call_ids(world, sid))
    box = q(driver, "[data-testid=command-input]")[0]
    box.send_keys("printf 'typed \\033[1;31mbold red\\033[0m\\n'; seq 1 5")
    q(driver, "[data-testid=command-submit]")[0].click()
    call_id = until(lambda: (set(_call_ids(world, sid)) - before) or None, WAIT_S)
    (call_id,) = call_id
    result = dshd_call(world["daemon"].socket, "tool.wait", {"sessionId": sid, "callId": call_id})
    assert result["exitCode"] == 0, result
    until(lambda: settled(driver, call_id), WAIT_S, what="its result in the page")
    shown = strip_sgr(result["content"])  # the page renders the escapes as styled spans
    assert shown == "typed bold red\n1\n2\n3\n4\n5\n"
    until(lambda: output_of(driver, call_id) == shown, WAIT_S,
          what=f"page output == tool.wait content {result['content']!r}")
    assert q(driver, f"[data-call-id='{call_id}'] .ansi-fg-1.ansi-bold")
    world["shots"].take(driver, "page-command")


def test_03b_the_cancel_button_cancels_a_running_call(world, driver):
    sid = session_id(world)
    before = set(_call_ids(world, sid))
    box = q(driver, "[data-testid=command-input]")[0]
    box.send_keys("echo sleeping; sleep 600")
    q(driver, "[data-testid=command-submit]")[0].click()
    (call_id,) = until(lambda: (set(_call_ids(world, sid)) - before) or None, WAIT_S)
    until(lambda: "sleeping" in (output_of(driver, call_id) or ""), LIVE_S, what="its output")
    call = q(driver, f"[data-testid=call][data-call-id='{call_id}']")[0]
    call.find_element("css selector", "[data-testid=cancel-call]").click()
    result = dshd_call(world["daemon"].socket, "tool.wait", {"sessionId": sid, "callId": call_id,
                                                              "timeout": WAIT_S})
    assert result["errorCode"] == "TOOL_CANCELLED", result
    entry = until(lambda: settled(driver, call_id), WAIT_S, what="the cancelled result")[0]
    assert entry.get_attribute("data-error-code") == "TOOL_CANCELLED"
    assert "sleeping" in output_of(driver, call_id)


def strip_sgr(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _call_ids(world, sid) -> list[str]:
    events = dshd_call(world["daemon"].socket, "session.events", {"sessionId": sid})["events"]
    return [_field(e, "callId") for e in events if e.get("type") == "tool/call"]


def _field(event: dict, name: str):
    return event.get("data", {}).get(name, event.get(name))


def test_04_a_model_call_is_allowed_by_a_click_and_runs_once(world, driver):
    sid = session_id(world)
    chat = q(driver, "[data-testid=chat-input]")[0]
    chat.send_keys("please run the command")
    q(driver, "[data-testid=chat-send]")[0].click()
    approval = until(lambda: q(driver, "[data-testid=approval]"), WAIT_S, what="the approval")[0]
    assert MODEL_COMMAND in text_of(approval)
    until(lambda: "I will run it." in "".join(
        text_of(n) for n in q(driver, "[data-testid=chat-text]")), WAIT_S)
    world["shots"].take(driver, "approval-asked")
    approval.find_element("css selector", "[data-testid=approve-once]").click()
    until(lambda: "Done: it ran." in "".join(
        text_of(n) for n in q(driver, "[data-testid=chat-text]")), WAIT_S, what="the turn's end")
    until(lambda: not q(driver, "[data-testid=approval]"), WAIT_S)
    events = dshd_call(world["daemon"].socket, "session.events", {"sessionId": sid})["events"]
    model_calls = [_field(e, "callId") for e in events if e.get("type") == "tool/call"
                   and MODEL_COMMAND in json.dumps(e)]
    assert len(model_calls) == 1, model_calls
    results = [e for e in events if e.get("type") == "tool/result"
               and _field(e, "callId") == model_calls[0]]
    assert len(results) == 1, results
    asked = [_field(e, "approvalId") for e in events if e.get("type") == "approval/asked"
             and _field(e, "callId") == model_calls[0]]
    assert len(asked) == 1, asked
    decided = [e for e in events if e.get("type") == "approval/decided"
               and _field(e, "approvalId") == asked[0]]
    assert [(_field(e, "outcome"), _field(e, "by")) for e in decided] == [
        ("allowed-once", "answerer")], decided
    assert (world["work"] / "model.txt").read_text() == "model-ran\n"  # ran exactly once
    until(lambda: "ran-by-the-model" in (output_of(driver, model_calls[0]) or ""), WAIT_S)
    world["shots"].take(driver, "approval-allowed")


def test_04b_chat_steer_and_cancel(world, driver):
    """A second turn (the script starts over: the model asks for the same command): steer it
    while its call waits for approval, then cancel the turn from the page: the call never
    runs and the approval goes away."""
    chat = q(driver, "[data-testid=chat-input]")[0]
    chat.send_keys("once more")
    q(driver, "[data-testid=chat-send]")[0].click()
    approval = until(lambda: q(driver, "[data-testid=approval]"), WAIT_S, what="the approval")[0]
    call_id = approval.get_attribute("data-call-id")
    chat.send_keys("and then stop")
    q(driver, "[data-testid=chat-steer]")[0].click()
    until(lambda: chat.get_attribute("value") == "", WAIT_S, what="the steer accepted")
    q(driver, "[data-testid=chat-cancel]")[0].click()
    until(lambda: not q(driver, "[data-testid=approval]"), WAIT_S, what="the approval withdrawn")
    entry = until(lambda: settled(driver, call_id), WAIT_S, what="the cancelled call settled")[0]
    assert entry.get_attribute("data-error-code") == "APPROVAL_CANCELLED"
    until(lambda: q(driver, "[data-testid=chat-send]")[0].is_enabled(), WAIT_S, what="turn over")
    assert (world["work"] / "model.txt").read_text() == "model-ran\n"  # not run again
    users = [text_of(n) for n in q(driver, "[data-testid=chat-user]")]
    assert users[-2:] == ["once more", "(steer) and then stop"], users
    world["shots"].take(driver, "chat-cancelled", show=q(driver, "[data-testid=chat]")[0])


def test_05_a_pty_program_receives_typed_keys(world, driver):
    sid = session_id(world)
    before = set(_call_ids(world, sid))
    q(driver, "[data-testid=command-tty]")[0].click()
    box = q(driver, "[data-testid=command-input]")[0]
    box.send_keys("read -r line; echo got:$line; read -r again")
    q(driver, "[data-testid=command-submit]")[0].click()
    q(driver, "[data-testid=command-tty]")[0].click()
    (call_id,) = until(lambda: (set(_call_ids(world, sid)) - before) or None, WAIT_S)
    until(lambda: q(driver, f"[data-testid=terminal][data-call-id='{call_id}'] .xterm-helper-textarea"),
          WAIT_S, what="the terminal")
    keys = q(driver, "[data-testid=terminal] .xterm-helper-textarea")[0]
    keys.send_keys("hello web\n")
    until(lambda: "got:hello web" in _screen(driver), WAIT_S, what="the echo in the terminal")
    driver.execute_script("window.scrollTo(0, 0)")
    world["shots"].take(driver, "pty-terminal")
    keys.send_keys("bye\n")
    result = dshd_call(world["daemon"].socket, "tool.wait", {"sessionId": sid, "callId": call_id})
    assert result["exitCode"] == 0 and "got:hello web" in result["content"], result
    assert "Content Security Policy" not in console(driver)  # xterm.js works under the CSP


def _click_text_in_terminal(driver, word: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    span = until(lambda: driver.execute_script(
        "const rows = document.querySelector('[data-testid=terminal] .xterm-rows');"
        "if (!rows) return null;"
        "for (const s of rows.querySelectorAll('span')) if (s.textContent.includes(arguments[0])) return s;"
        "for (const r of rows.children) if (r.textContent.includes(arguments[0])) return r;"
        "return null;", word), WAIT_S, what=f"{word} on the terminal")
    ActionChains(driver).move_to_element(span).pause(0.3).move_by_offset(1, 0).pause(0.3).click().perform()


def test_05b_terminal_links_open_only_http(world, driver):
    """OSC 8 hyperlinks in a terminal: a javascript: link does nothing when clicked (xterm's
    default handler would offer to open any scheme); an http link opens a new tab."""
    sid = session_id(world)
    before = set(_call_ids(world, sid))
    q(driver, "[data-testid=command-tty]")[0].click()
    box = q(driver, "[data-testid=command-input]")[0]
    box.send_keys("printf '\\033]8;;javascript:window.__pwned=1\\033\\\\EVILLINK\\033]8;;\\033\\\\ "
                  "\\033]8;;http://127.0.0.1:9/fine\\033\\\\GOODLINK\\033]8;;\\033\\\\\\n'; read -r x")
    q(driver, "[data-testid=command-submit]")[0].click()
    q(driver, "[data-testid=command-tty]")[0].click()
    (call_id,) = until(lambda: (set(_call_ids(world, sid)) - before) or None, WAIT_S)
    until(lambda: q(driver, f"[data-testid=terminal][data-call-id='{call_id}']"), WAIT_S)
    until(lambda: "GOODLINK" in _screen(driver), WAIT_S, what="the links on the terminal")
    tabs = set(driver.window_handles)
    _click_text_in_terminal(driver, "EVILLINK")
    time.sleep(1.0)  # nothing may happen: give it the time it would take
    from selenium.common.exceptions import NoAlertPresentException
    try:
        alert = driver.switch_to.alert
        text = alert.text
        alert.dismiss()
        pytest.fail(f"a javascript: link asked to be opened: {text!r}")
    except NoAlertPresentException:
        pass
    assert driver.execute_script("return window.__pwned") is None
    assert set(driver.window_handles) == tabs
    _click_text_in_terminal(driver, "GOODLINK")
    until(lambda: len(driver.window_handles) > len(tabs), WAIT_S, what="the http link's new tab")
    main = driver.current_window_handle
    for handle in set(driver.window_handles) - tabs:
        driver.switch_to.window(handle)
        driver.close()
    driver.switch_to.window(main)
    keys = q(driver, "[data-testid=terminal] .xterm-helper-textarea")[0]
    keys.send_keys("\n")
    result = dshd_call(world["daemon"].socket, "tool.wait", {"sessionId": sid, "callId": call_id})
    assert result["exitCode"] == 0, result


def _screen(driver) -> str:
    rows = q(driver, "[data-testid=terminal] .xterm-rows")
    return text_of(rows[0]) if rows else ""


def test_06_the_page_recovers_from_a_bridge_kill_by_itself(world, driver):
    driver.execute_script("window.__noReload = 'still-here'")
    bridge = world["bridge"]
    bridge.kill()
    until(lambda: status(driver).startswith("connection lost"), WAIT_S, what="the outage shown")
    assert q(driver, "#banner")[0].is_displayed()
    world["shots"].take(driver, "bridge-down")
    bridge.start()
    until(lambda: status(driver) == "connected", WAIT_S, what="reconnected")
    proc = dsh(world, "run", "--name", SESSION, "--", "echo", "after the restart")
    assert proc.wait(WAIT_S) == 0, proc.stderr.read()
    shown = until(lambda: [n for n in q(driver, "[data-testid=recent-result]")
                           if "after the restart" in text_of(n)],
                  WAIT_S, what="a new run's output after the restart")
    assert driver.execute_script("return window.__noReload") == "still-here"
    world["shots"].take(driver, "bridge-recovered", show=shown[0])


def test_07_the_page_says_dshd_is_away_and_recovers(world, driver):
    """dshd stops (the bridge closes the WebSocket, then refuses with 4001 "dshd is not
    running") and starts again: the banner names it, and the page resumes by itself."""
    daemon = world["daemon"]
    daemon.stop()
    until(lambda: "dshd" in status(driver), WAIT_S, what="the banner naming dshd")
    assert q(driver, "#banner")[0].is_displayed()
    world["shots"].take(driver, "dshd-down")
    daemon.start()
    until(lambda: status(driver) == "connected", WAIT_S, what="reconnected to dshd")
    proc = dsh(world, "run", "--name", SESSION, "--", "echo", "dshd is back")
    assert proc.wait(WAIT_S) == 0, proc.stderr.read()
    until(lambda: any("dshd is back" in text_of(n)
                      for n in q(driver, "[data-testid=recent-result] [data-testid=call-output]")),
          WAIT_S, what="a new run's output after dshd's restart")
    assert driver.execute_script("return window.__noReload") == "still-here"


def test_08_two_browsers_and_the_cli_stay_equal(world, driver):
    sid = session_id(world)
    second = chrome((420, 860))  # a phone's width
    try:
        second.get(world["bridge"].url)
        until(lambda: status(second) == "connected", WAIT_S)
        select_session(second, sid)
        select_session(driver, sid)
        with LaneWatcher(world["daemon"].socket, sid) as cli:
            box = q(second, "[data-testid=command-input]")[0]
            box.send_keys("for i in 1 2 3; do echo tick $i; sleep 0.1; done")
            q(second, "[data-testid=command-submit]")[0].click()
            proc = dsh(world, "run", "--name", SESSION, "--", "sh", "-c", "echo from the cli")
            assert proc.wait(WAIT_S) == 0
            until(lambda: _all_settled(cli.value), WAIT_S, what="every call settled")

            def equal():
                a = driver.execute_script("return window.dshMirror()")
                b = second.execute_script("return window.dshMirror()")
                return a == b == cli.value and a

            value = until(equal, WAIT_S, what="the three mirrors equal")
            assert len(value["recent"]) >= 6
            world["shots"].take(second, "phone-width-second-browser")
    finally:
        second.quit()


def _all_settled(value) -> bool:
    return bool(value) and not value["tools"] and len(value["recent"]) >= 6


def test_09_signed_out_says_so_instead_of_reconnecting(world, driver):
    """No token in the page's storage, or a token (and cookie) older than --new-token: the
    page says to open the URL dsh web printed; the new URL signs it in again."""
    bridge = world["bridge"]
    driver.get(bridge.url)
    until(lambda: status(driver) == "connected", WAIT_S, what="connected")
    driver.execute_script("localStorage.removeItem('dsh-web-token')")
    driver.refresh()
    until(lambda: status(driver).startswith("signed out"), WAIT_S, what="signed out (no token)")
    assert status(driver) == "signed out: open the URL dsh web printed"
    assert q(driver, "#banner")[0].is_displayed()
    world["shots"].take(driver, "signed-out")
    driver.get(bridge.url)
    until(lambda: status(driver) == "connected", WAIT_S, what="signed in again")
    bridge.stop()
    old = bridge.token
    bridge.start("--new-token")
    assert bridge.token != old
    until(lambda: status(driver).startswith("signed out"), WAIT_S, what="signed out (stale token)")
    driver.get(bridge.url)
    until(lambda: status(driver) == "connected", WAIT_S, what="the new token signs in")
