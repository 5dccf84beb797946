"""infra/lifeline.py: a launcher's identity survives pid reuse; a watchdog acts only on death."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from infra.lifeline import Launcher

ROOT = Path(__file__).resolve().parent.parent


def test_a_launcher_is_alive_only_while_that_very_process_runs():
    me = Launcher.this()
    assert me.alive() and me.start > 0
    assert Launcher.parse(me.tag()) == me
    assert Launcher.parse(replace(me, host="node-1.cluster.example").tag()).host == "node-1.cluster.example"
    assert not replace(me, start=me.start + 1).alive()  # the same pid, another process: a reused pid
    assert replace(me, host="another-host").alive()  # not ours to judge
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not Launcher(me.host, child.pid, me.start).alive()
    assert Launcher.parse("not a launcher") is None


def test_on_death_runs_its_command_when_the_launcher_dies_and_not_when_it_leaves(tmp_path):
    code = (
        "import sys, time; from infra.lifeline import on_death\n"
        "with on_death(['touch', sys.argv[1] + '/left']):\n"
        "    pass\n"
        "with on_death(['touch', sys.argv[1] + '/died']):\n"
        "    print('in', flush=True); time.sleep(600)\n"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert launcher.stdout.readline() == "in\n"
    launcher.kill()  # however far its watchdog got (even not yet waiting), the command runs
    launcher.wait()
    deadline = time.monotonic() + 10
    while not (tmp_path / "died").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "died").exists() and not (tmp_path / "left").exists()
