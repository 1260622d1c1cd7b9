"""Support of the browser tests (tests/web/test_browser*.py): the headless Chromium, the
screenshots, and a Python client of the same dshd to check the page against.

Theory of operation: :func:`chrome` starts Debian's ``/usr/bin/chromium`` through
``/usr/bin/chromedriver``, both paths given explicitly (Selenium Manager, which would
download a driver, is never invoked: a ``Service`` with an executable path and a
``binary_location`` leave it nothing to find), headless with a fixed window size.
:func:`chromium_missing` is the one skip reason. :class:`Shots` saves a PNG per step under
``$DSH_ARTIFACTS/browser`` (else a pytest temporary directory) and prints where.
:func:`dshd_call` runs one request on a fresh ``client.api`` connection (trio in this thread);
:class:`LaneWatcher` keeps a ``client.api`` subscription open in a thread of its own for the
whole test and exposes the latest mirror value (the CLI's view, compared with the pages').
:func:`until` is a bounded poll: liveness bounds, not speed assertions.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import trio

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WINDOW = (1280, 900)


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (path.is_file() and os.access(path, os.X_OK)):
            return f"{path} is missing: install Debian's {package} (apt-get install -y {package})"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    return None


def chrome(window: tuple[int, int] = WINDOW):
    """A headless Chromium driven by the system chromedriver (nothing downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                f"--window-size={window[0]},{window[1]}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console, for failures
    service = Service(executable_path=str(CHROMEDRIVER))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_window_size(*window)
    return driver


class Shots:
    """Numbered screenshots of the steps, saved as test artifacts."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.n = 0
        self.paths: list[Path] = []
        print(f"\nbrowser screenshots: {self.dir}", flush=True)

    def take(self, driver, name: str, show=None) -> Path:
        """Save the window (scrolled so that the element ``show`` is in view, when given)."""
        if show is not None:
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", show)
        self.n += 1
        path = self.dir / f"{self.n:02d}-{name}.png"
        driver.save_screenshot(str(path))
        self.paths.append(path)
        return path


def page_fixtures(window: tuple[int, int] = WINDOW):
    """A browser module's ``driver`` (one Chromium of ``window`` for its in-order steps; the
    module's ``world`` first) and ``page_console`` (autouse: the page's console printed after
    each step, which pytest shows when the step fails). A module binds both names:
    ``driver, page_console = page_fixtures()``."""

    @pytest.fixture(scope="module")
    def driver(world):
        d = chrome(window)
        try:
            yield d
        finally:
            d.quit()

    @pytest.fixture(autouse=True)
    def page_console(driver):
        yield
        print(f"\npage console:\n{console(driver)}")

    return driver, page_console


def console(driver) -> str:
    """The page's console messages so far (for a failing step's message)."""
    try:
        return "\n".join(f"{e['level']}: {e['message']}" for e in driver.get_log("browser"))
    except Exception as exc:  # noqa: BLE001 - only a diagnostic
        return f"(no console log: {exc})"


def artifacts_dir(tmp_path_factory) -> Path:
    base = os.environ.get("DSH_ARTIFACTS")
    if base:
        target = Path(base) / "browser"
        shutil.rmtree(target, ignore_errors=True)
        return target
    return tmp_path_factory.mktemp("browser-shots")


def until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05,
          what: str = "") -> Any:
    """Poll ``predicate`` until it is truthy (its value) or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s: {what or predicate}")
        time.sleep(interval)


def dshd_call(socket: Path, method: str, params: dict | None = None) -> Any:
    """One request to dshd on a fresh connection of the Python client."""
    from client.api import connect

    async def main():
        async with connect(socket, "dsh-test") as c:
            return await c.call(method, params or {})

    return trio.run(main)


class LaneWatcher:
    """A ``client.api`` subscription of one session, followed in its own thread for as long as
    the watcher is open; ``value`` is the latest mirror value (a JSON copy)."""

    def __init__(self, socket: Path, session_id: str) -> None:
        self.socket = socket
        self.session_id = session_id
        self._value: str | None = None
        self._lock = threading.Lock()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "LaneWatcher":
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError("the Python client's subscription did not start within 30 s")
        if self._error:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None and self._scope is not None:
            trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(30)

    @property
    def value(self) -> Any:
        if self._error:
            raise self._error
        with self._lock:
            return None if self._value is None else json.loads(self._value)

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        from client.api import connect

        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:
            self._scope = scope
            async with connect(self.socket, "dsh-test-mirror") as c:
                sub = await c.subscribe(self.session_id)
                async with sub:
                    while True:
                        view = await sub.next_view()
                        with self._lock:
                            self._value = json.dumps(view)
                        self._ready.set()


@contextmanager
def browser_world(prefix: str, model_command: str, shots_dir: Path) -> Iterator[dict[str, Any]]:
    """A browser module's world: dshd with a scripted model (one step proposing
    ``model_command``, then "Done: it ran."), its bridge, a work directory and the screenshots."""
    from tests.e2e.conftest import running_daemon  # the e2e and web harnesses, loaded on use
    from tests.web.conftest import WebBridge

    root = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    work = root / "work"
    work.mkdir()
    script = root / "script.jsonl"
    script.write_text(
        json.dumps({"text": "I will run it.", "toolCalls": [
            {"name": "bash", "arguments": {"command": model_command}}], "paceMs": 5}) + "\n"
        + json.dumps({"text": "Done: it ran.", "paceMs": 5}) + "\n")
    config = f'[model]\nprovider = "scripted"\nscript = "{script}"\n'
    with running_daemon(config, prefix=f"{prefix}d-") as daemon:
        bridge = WebBridge(daemon.socket, root / "tok" / "web-token")
        bridge.start()
        try:
            yield {"daemon": daemon, "bridge": bridge, "work": work, "shots": Shots(shots_dir)}
        finally:
            bridge.close()
            shutil.rmtree(root, ignore_errors=True)
