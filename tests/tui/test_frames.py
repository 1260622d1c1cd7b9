"""``client.tui.frames``: ``dsh tui`` loads Textual with its frame cap (1000 a second, a
person's ``TEXTUAL_FPS`` kept, nothing leaked to child processes, the CLI loading no Textual
before the command does) and freezes its long-lived objects while its screen is up.

What the two buy (a key's frame within one frame under a 1 GiB flood) is measured by
``bench/bench_tui_latency.py``; these tests check that the settings are in force in what
people run.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys

from client.tui.app import DshApp
from client.tui.frames import MAX_FPS
from tests.tui.conftest import run_app

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "TEXTUAL_FPS"}
    environ.update(env)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_tui_loads_textual_with_the_frame_cap_and_leaves_the_environment_alone():
    out = _python("import os, client.tui.app, textual.constants as c, textual.screen as s; "
                  "print(c.MAX_FPS, round(1 / s.UPDATE_PERIOD), os.environ.get('TEXTUAL_FPS'))")
    assert out == f"{MAX_FPS} {MAX_FPS} None"
    assert MAX_FPS > 60  # Textual's own default: a key's frame could wait a whole frame


def test_a_person_s_own_textual_fps_is_kept():
    assert _python("import client.tui.app, textual.constants as c; print(c.MAX_FPS)",
                   TEXTUAL_FPS="30") == "30"


def test_textual_loaded_before_keeps_its_value_and_the_call_says_so():
    out = _python("import textual.constants as c; from client.tui.frames import set_frame_cap; "
                  "print(set_frame_cap(), c.MAX_FPS)")
    assert out == "None 60"


def test_the_dsh_cli_does_not_load_textual_before_the_tui_command_does():
    # Were any CLI module to import Textual at start, `dsh tui` would run at Textual's 60.
    assert _python("import sys, client.cli, client.cli.main; "
                   "print('textual.constants' in sys.modules)") == "False"
    out = _python("import sys; from click.testing import CliRunner; "
                  "from client.cli.main import cli; "
                  "r = CliRunner().invoke(cli, ['tui', '--help']); "
                  "import client.tui.app, textual.constants as c; print(r.exit_code, c.MAX_FPS)")
    assert out == f"0 {MAX_FPS}"


def test_long_lived_objects_are_frozen_while_the_screen_is_up_and_thawed_after():
    before = gc.get_freeze_count()
    seen: list[int] = []

    async def scenario(pilot):
        await pilot.pause()
        await pilot.pause()
        seen.append(gc.get_freeze_count())

    run_app(DshApp(connect=False), scenario)
    assert seen and seen[0] > before + 1000  # the app's widgets, Textual's and Rich's objects
    assert gc.get_freeze_count() == 0  # given back: the next app's objects are not kept
