"""Processes that end with the process that started them, however it ends (SIGKILL included).

Linux's PR_SET_PDEATHSIG has the kernel signal a process when its parent dies; it
survives exec. Two places use it, so no part of a job outlives its launcher:
- the launcher starts each agent (infra/zygote.py, or torchrun) as `python -m infra.lifeline
  PARENT_PID CMD...`, which sets the signal and execs CMD, so the agent dies with the
  launcher (a `ddlbench train` or an Airflow task killed outright, an OOM kill);
- every rank dies with its agent: a forked rank sets the signal as it is forked, and a rank
  that torchrun starts (in a session of its own) calls `die_with_agent()` first thing,
  before importing torch.

A job that a scheduler runs (a SLURM job, a Kubernetes Job) has no process of the launcher's
to signal. For those the launcher starts a watchdog, `python -m infra.lifeline --on-death
PARENT_PID CMD...` (`on_death`), in a session of its own: it waits on the launcher's pidfd
and runs CMD (scancel, a Job's deletion) when the launcher is gone; a launcher that ends
normally stops its watchdog first. The job also carries its launcher's identity (`Launcher`:
host, pid, start time), so a later sweep (`ddlbench cleanup`, the provider's next provision)
ends jobs whose launcher died while its watchdog was gone too.

Only the standard library here: a rank calls it before its heavy imports.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1


def name_this_process(name: str) -> None:
    """Set this process's name (its `comm`, what ps and top show; at most 15 bytes)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


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


def exit_code(err: SystemExit) -> int:
    """The status `sys.exit(x)` leaves with, as the interpreter reads x (a message: 1)."""
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)
    return 1


def leave_now(code: int) -> None:
    """Flush the standard streams and leave at once: no interpreter teardown (most of a second
    with torch loaded), for a process whose work and children are done, or a fork's."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def die_with_agent(sig: int = signal.SIGKILL) -> None:
    """A rank's lifeline: die with the agent that started it. An agent killed while
    the rank was starting has already left it reparented to a process that is no agent (pid 1,
    a subreaper): exit then. An agent may itself be pid 1 (a Kubernetes pod's first process)."""
    if not any(marker in _cmdline(os.getppid()) for marker in _AGENT_MARKERS):
        os._exit(128 + int(sig))
    die_with_parent(sig=sig)


_AGENT_MARKERS = ("infra.zygote", "torch.distributed.run", "torchrun")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return " ".join(_AGENT_MARKERS)  # not knowable here (no /proc): trust the parent


def wrap(argv: list[str]) -> list[str]:
    """`argv` run so that it dies with this process (the launcher)."""
    return [sys.executable, "-m", "infra.lifeline", str(os.getpid()), *argv]


def _start_ticks(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid,
    it names one process for ever (a pid alone may be reused). None once it has exited (a zombie
    waiting to be reaped has exited too)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if stat[0] == "Z" else int(stat[19])


@dataclass(frozen=True)
class Launcher:
    """The process that launched a job, as the job records it (a SLURM comment, Kubernetes labels)."""

    host: str
    pid: int
    start: int  # clock ticks since boot, 0 where unknown

    @classmethod
    def this(cls) -> Launcher:
        return cls.of(os.getpid())

    @classmethod
    def of(cls, pid: int) -> Launcher:
        """A process of this host, named by its pid and start time."""
        return cls(socket.gethostname(), pid, _start_ticks(pid) or 0)

    def tag(self) -> str:
        return f"{self.host}.{self.pid}.{self.start}"

    @classmethod
    def parse(cls, tag: str) -> Launcher | None:
        host, _, rest = tag.strip().rpartition(".")
        host, _, pid = host.rpartition(".")
        if not host or not pid.isdigit() or not rest.isdigit():
            return None
        return cls(host, int(pid), int(rest))

    def here(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool:
        """Whether it still runs; a launcher on another host is taken to (it is not ours to judge)."""
        if not self.here():
            return True
        ticks = _start_ticks(self.pid)
        return ticks is not None and (self.start == 0 or ticks == self.start)


@contextmanager
def watchdog(argv: list[str]) -> Iterator[None]:
    """Keep `argv` running, in a session of its own, while inside the block; stop it on leaving.
    `argv` is a watchdog: it waits for this process to die (`wait_for_exit`), then acts."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=importable_env(),
    )
    try:
        yield
    finally:
        proc.terminate()
        proc.wait()


def on_death(argv: list[str]) -> AbstractContextManager[None]:
    """Run `argv` if this process dies (SIGKILL included) inside the block; not if it leaves it."""
    return watchdog([sys.executable, "-m", "infra.lifeline", "--on-death", str(os.getpid()), *argv])


def importable_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def wait_for_exit(parent: int) -> None:
    """Return once `parent` (this process's parent when it started) has exited."""
    try:
        fd = os.pidfd_open(parent)
    except ProcessLookupError:
        return
    try:
        if os.getppid() == parent:  # the fd is our launcher's, not a reused pid's
            select.select([fd], [], [])  # readable once it has exited
    finally:
        os.close(fd)


def main() -> None:
    args = sys.argv[1:]
    after_death = args[:1] == ["--on-death"]
    args = args[1:] if after_death else args
    if len(args) < 2 or not args[0].isdigit():
        print("usage: python -m infra.lifeline [--on-death] PARENT_PID CMD [ARG...]", file=sys.stderr)
        sys.exit(2)
    if after_death:
        wait_for_exit(int(args[0]))
        os.execvp(args[1], args[1:])
    die_with_parent(int(args[0]))
    os.execvp(args[1], args[1:])


if __name__ == "__main__":
    main()
