"""Processes that end with the process that started them, however it ends (SIGKILL included).

Linux's PR_SET_PDEATHSIG has the kernel signal a process when its parent dies; it
survives exec. Two places use it, so no part of a job outlives its launcher:
- the launcher starts each torchrun agent as `python -m infra.lifeline PARENT_PID
  CMD...`, which sets the signal and execs CMD, so the agent dies with the launcher
  (a `ddlbench train` or an Airflow task killed outright, an OOM kill);
- every rank calls `die_with_torchrun()` first thing, before importing torch, so it dies
  with its torchrun agent (which starts ranks in sessions of their own).

Only the standard library here: a rank calls it before its heavy imports.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send `sig` to this process when its parent exits; exit at once if the
    parent (`expected_parent`, default the current one) is gone by the time it is set."""
    parent = os.getppid() if expected_parent is None else expected_parent
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before the signal was set: we were reparented
        os._exit(128 + int(sig))


def die_with_torchrun(sig: int = signal.SIGKILL) -> None:
    """A rank's lifeline: die with the torchrun agent that started it. An agent killed while
    the rank was starting has already left it reparented to a process that is no agent (pid 1,
    a subreaper): exit then. An agent may itself be pid 1 (a Kubernetes pod's first process)."""
    if not any(marker in _cmdline(os.getppid()) for marker in _AGENT_MARKERS):
        os._exit(128 + int(sig))
    die_with_parent(sig=sig)


_AGENT_MARKERS = ("torch.distributed.run", "torchrun")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return " ".join(_AGENT_MARKERS)  # not knowable here (no /proc): trust the parent


def wrap(argv: list[str]) -> list[str]:
    """`argv` run so that it dies with this process (the launcher)."""
    return [sys.executable, "-m", "infra.lifeline", str(os.getpid()), *argv]


def main() -> None:
    if len(sys.argv) < 3:
        print("usage: python -m infra.lifeline PARENT_PID CMD [ARG...]", file=sys.stderr)
        sys.exit(2)
    die_with_parent(int(sys.argv[1]))
    os.execvp(sys.argv[2], sys.argv[2:])


if __name__ == "__main__":
    main()
