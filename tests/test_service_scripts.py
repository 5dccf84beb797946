"""The service scripts' pid files (scripts/services/_common.sh `pid_alive`): a daemon is alive
where its pid file's process lives and is the program the file is named after. A stale file
whose pid another process took by now is no daemon: the script starts it again, and a stop
signals no stranger."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMON = Path(__file__).resolve().parent.parent / "scripts" / "services" / "_common.sh"


def _alive(pidfile: Path) -> bool:
    done = subprocess.run(["bash", "-c", f'. "{COMMON}"; pid_alive "$1"', "_", str(pidfile)], check=False)
    return done.returncode == 0


@pytest.mark.parametrize("suffix", ["", "-snode0"])
def test_a_pid_file_names_its_program(tmp_path: Path, suffix: str) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / f"sleep{suffix}.pid").write_text(f"{sleeper.pid}\n")
        assert _alive(tmp_path / f"sleep{suffix}.pid")
        # The same live pid under another program's name: a stale file whose pid was reused.
        (tmp_path / f"slurmd{suffix}.pid").write_text(f"{sleeper.pid}\n")
        assert not _alive(tmp_path / f"slurmd{suffix}.pid")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not _alive(tmp_path / f"sleep{suffix}.pid")  # gone
    assert not _alive(tmp_path / "missing.pid")


def test_a_zombie_is_not_alive(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    try:
        name = Path(f"/proc/{child.pid}/comm").read_text().strip()  # the program, as ps names it
        (tmp_path / f"{name}.pid").write_text(f"{child.pid}\n")
        assert not _alive(tmp_path / f"{name}.pid")
    finally:
        child.wait()
