"""What a person sees in a real headless Chromium when the sign-in, dshd or another session
needs them (real dshd with a scripted model, real ``dsh web``, the real ``dsh`` CLI):

* a foreign page sending the browser to ``/#token=JUNK`` neither stores the junk nor signs the
  page out (the fragment is taken only right after the bridge's token exchange);
* signed out, the banner names the URL to open, and the page stops retrying;
* with dshd down the live parts are dimmed and disabled, the banner says what to do, and a
  command is refused at once and never runs later;
* an approval pending in another session is a notice with its session and command and a
  button that goes there to answer it;
* a settled call's output box opens scrolled to its end.

The steps share one world and run in file order; waits are generous liveness bounds.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.web.browser_support import (artifacts_dir, browser_world, chromium_missing,
                                       dshd_call, page_fixtures, until)

_missing = chromium_missing()
pytestmark = pytest.mark.skipif(_missing is not None, reason=f"browser tests: {_missing}")

WAIT_S = 20.0
SESSION = "outage"
MODEL_COMMAND = "echo asked-elsewhere"
JUNK = "JUNKjunkJUNKjunkJUNKjunk0123456789abcdefgh"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with browser_world("dsh-webo", MODEL_COMMAND, artifacts_dir(tmp_path_factory)) as world:
        yield world


driver, page_console = page_fixtures()


def q(driver, css: str):
    return driver.find_elements("css selector", css)


def text_of(node) -> str:
    return node.get_attribute("textContent") or ""


def status(driver) -> str:
    nodes = q(driver, "[data-testid=conn-status]")
    return text_of(nodes[0]) if nodes else ""


def banner(driver) -> str:
    return text_of(q(driver, "#banner")[0])


def stored_token(driver) -> str | None:
    return driver.execute_script("return localStorage.getItem('dsh-web-token')")


def dsh_run(world, name: str, *argv: str) -> None:
    r = subprocess.run([sys.executable, "-m", "client.cli", "run", "--name", name, "--", *argv],
                       cwd=world["work"], env=dict(world["daemon"].env), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode == 0, r.stderr


def session_id(world, name: str) -> str:
    return dshd_call(world["daemon"].socket, "session.find", {"ref": name})["sessionId"]


def select_session(driver, sid: str) -> None:
    row = until(lambda: q(driver, f"[data-testid=session-row][data-session-id='{sid}']"),
                WAIT_S, what=f"session row {sid}")[0]
    row.click()
    until(lambda: (driver.execute_script("return window.dshMirror()") or {}).get(
        "session", {}).get("sessionId") == sid, WAIT_S, what="the session's mirror")


def test_01_a_foreign_fragment_token_is_ignored_and_the_good_one_kept(world, driver):
    bridge = world["bridge"]
    dsh_run(world, SESSION, "echo", "hello")
    driver.get(bridge.url)
    until(lambda: status(driver) == "connected", WAIT_S, what="signed in")
    assert stored_token(driver) == bridge.token
    driver.get("about:blank")
    driver.get(f"{bridge.base}/#token={JUNK}")  # what an attacker's link does
    until(lambda: "token=" not in driver.current_url, WAIT_S, what="the fragment removed")
    until(lambda: status(driver) == "connected", WAIT_S, what="still signed in")
    assert stored_token(driver) == bridge.token
    driver.execute_script(f"location.hash = '#token={JUNK}'")  # the same, to an open page
    until(lambda: "token=" not in driver.current_url, WAIT_S, what="removed from an open page")
    assert stored_token(driver) == bridge.token and status(driver) == "connected"
    world["shots"].take(driver, "foreign-fragment-ignored")


def test_02_signed_out_names_the_url_and_stops_retrying(world, driver):
    bridge = world["bridge"]
    driver.execute_script("localStorage.removeItem('dsh-web-token')")
    driver.refresh()
    until(lambda: status(driver).startswith("signed out"), WAIT_S, what="signed out")
    words = banner(driver)
    assert f"{bridge.base}/?token=" in words and "dsh web" in words, words
    assert q(driver, "#banner")[0].is_displayed()
    held = "return dshApp.conn._held && dshApp.conn._timer === null && dshApp.conn._ws === null"
    until(lambda: driver.execute_script(held), WAIT_S, what="no reconnect loop while signed out")
    world["shots"].take(driver, "signed-out-url")
    driver.get(bridge.url)
    until(lambda: status(driver) == "connected", WAIT_S, what="signed in again")


def test_03_dshd_down_dims_disables_and_refuses_a_command(world, driver):
    daemon = world["daemon"]
    select_session(driver, session_id(world, SESSION))
    box = q(driver, "[data-testid=command-input]")[0]
    assert box.is_enabled()
    daemon.stop()
    until(lambda: "dshd" in status(driver), WAIT_S, what="dshd away")
    assert not box.is_enabled() and not q(driver, "[data-testid=command-submit]")[0].is_enabled()
    assert not q(driver, "[data-testid=chat-input]")[0].is_enabled()
    opacity = driver.execute_script(
        "return getComputedStyle(document.querySelector('[data-testid=live]')).opacity")
    assert float(opacity) < 1, opacity
    words = banner(driver)
    assert "start dshd again" in words and "nothing" in words, words
    # A command that reached run() anyway (typed just as the connection dropped) is refused.
    driver.execute_script("const v = dshApp.view; v.commandInput.value = 'touch ran-while-down'; v.run();")
    note = until(lambda: [n for n in q(driver, "[data-testid=note]")
                          if "dshd is not reachable; nothing was run" in text_of(n)],
                 WAIT_S, what="the refusal")
    world["shots"].take(driver, "dshd-down-dimmed", show=note[0])
    daemon.start()
    until(lambda: status(driver) == "connected", WAIT_S, what="reconnected")
    until(lambda: box.is_enabled(), WAIT_S, what="the box enabled again")
    box.clear()
    box.send_keys("echo after-the-outage")
    q(driver, "[data-testid=command-submit]")[0].click()
    until(lambda: any("after-the-outage" in text_of(n) for n in q(
        driver, "[data-testid=recent-result] [data-testid=call-output]")), WAIT_S,
        what="a command after the outage")
    assert not (world["work"] / "ran-while-down").exists(), "the refused command ran later"


def test_04_an_approval_in_another_session_is_a_notice_that_goes_there(world, driver):
    shown = session_id(world, SESSION)
    dsh_run(world, "elsewhere", "true")
    other = session_id(world, "elsewhere")
    select_session(driver, shown)
    dshd_call(world["daemon"].socket, "turn.start", {"sessionId": other, "input": "go"})
    notice = until(lambda: q(driver, f"[data-testid=approval-notice][data-session-id='{other}']"),
                   WAIT_S, what="the notice of the other session's approval")[0]
    assert "elsewhere" in text_of(notice) and MODEL_COMMAND in text_of(notice), text_of(notice)
    assert notice.is_displayed()
    world["shots"].take(driver, "approval-elsewhere", show=notice)
    notice.find_element("css selector", "[data-testid=open-approval]").click()
    card = until(lambda: q(driver, "[data-testid=approval]"), WAIT_S, what="the approval there")[0]
    assert MODEL_COMMAND in text_of(card)
    until(lambda: not q(driver, "[data-testid=approval-notice]"), WAIT_S,
          what="no notice for the session shown")
    card.find_element("css selector", "[data-testid=approve-once]").click()
    until(lambda: not q(driver, "[data-testid=approval]"), WAIT_S, what="answered")


_AT_END = """const box = arguments[0];
return box.scrollHeight > box.clientHeight + 20
  && box.scrollTop + box.clientHeight >= box.scrollHeight - 8;"""


def test_05_a_settled_output_opens_at_its_end(world, driver):
    sid = session_id(world, SESSION)
    select_session(driver, sid)
    box = q(driver, "[data-testid=command-input]")[0]
    box.send_keys("for i in $(seq 1 300); do echo typed-line-$i; done; sleep 0.3; echo typed-end")
    q(driver, "[data-testid=command-submit]")[0].click()
    dsh_run(world, SESSION, "sh", "-c", "seq 1 300; echo cli-end")  # settled before it is shown
    for end in ("typed-end", "cli-end"):
        out = until(lambda: [n for n in q(driver, "[data-testid=recent-result] [data-testid=call-output]")
                             if text_of(n).rstrip().endswith(end)], WAIT_S, what=f"{end} settled")[0]
        until(lambda: driver.execute_script(_AT_END, out), WAIT_S, what=f"{end}'s box at its end")
    # Another session and back: the boxes are made again, and open at their end too.
    select_session(driver, session_id(world, "elsewhere"))
    select_session(driver, sid)
    out = until(lambda: [n for n in q(driver, "[data-testid=recent-result] [data-testid=call-output]")
                         if text_of(n).rstrip().endswith("cli-end")], WAIT_S, what="shown again")[0]
    until(lambda: driver.execute_script(_AT_END, out), WAIT_S, what="at its end when shown again")
    world["shots"].take(driver, "settled-at-end", show=out)
