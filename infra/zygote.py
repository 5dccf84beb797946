"""The launcher of one agent's ranks, forked from one warm interpreter (`python -m infra.zygote`).

    python -m infra.zygote --nprocs=3,2 --agent=0 [--master-addr=A --master-port=P] -m MODULE ARG...

`--nprocs` lists every agent's rank count in rank order (the placement's agents, infra/placement.py),
so an agent knows its ranks' global numbers and the world without a rendezvous: the provider placed
the job before it started. The launcher imports torch and the ranks' module once, then forks its
ranks, which start with both already imported: a rank no longer pays its own interpreter and torch
import, nor a torchrun agent's, before its first step. Each job still gets fresh processes and a
fresh process group (the forks are new processes; the launcher never touches torch.distributed
beyond hosting the store).

Agent 0's launcher hosts the job's TCPStore (at the master port, or a free one on one host), as
torchrun's agent does, and every rank joins it as a client (TORCHELASTIC_USE_AGENT_STORE), so a
rank that dies takes no store with it. The ranks see torchrun's environment (RANK, LOCAL_RANK,
WORLD_SIZE, GROUP_RANK, MASTER_ADDR, ...) and are named `rank-N` (ps, top, psutil's name()).

When a rank fails, the launcher says so in torchrun's words ("failed (exitcode: ...)", "closing
signal SIGTERM"), stops the others (SIGTERM, SIGKILL after a grace: a stopped rank never acts on
SIGTERM), prints torchrun's failure summary with every failed rank's global number and exits 1;
infra/base.py reads it as it reads torchrun's. A job with restarts is left to torchrun
(`infra.base.launch_argv`): restarting every agent's ranks together is its elastic agent's work.

Each rank dies with this launcher (PR_SET_PDEATHSIG), and the launcher with the job's launcher
(infra/lifeline.py). The forks run the module as `python -m` would, as `__main__`, and leave
as an interpreter does (non-daemon threads joined, atexit handlers run, streams flushed).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from infra import warm
from infra.lifeline import die_with_parent, exit_code, leave_now, name_this_process

STOP_GRACE_S = 2.0  # a failed job's other ranks' time to act on SIGTERM (infra/base.py waits 3 s)
POLL_S = 0.05


@dataclass(frozen=True)
class World:
    """Where one agent's ranks sit in the job's world."""

    nprocs: tuple[int, ...]  # every agent's rank count, in rank order
    agent: int

    @property
    def local(self) -> int:
        return self.nprocs[self.agent]

    @property
    def first(self) -> int:
        return sum(self.nprocs[: self.agent])

    @property
    def size(self) -> int:
        return sum(self.nprocs)

    def env(self, local_rank: int, master_addr: str, master_port: int) -> dict[str, str]:
        """torchrun's environment for one rank."""
        rank = self.first + local_rank
        return {
            "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(self.size),
            "LOCAL_WORLD_SIZE": str(self.local), "GROUP_RANK": str(self.agent),
            "GROUP_WORLD_SIZE": str(len(self.nprocs)), "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(self.size),
            "ROLE_NAME": "default", "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none",
        }


def _counts(text: str) -> tuple[int, ...]:
    counts = tuple(int(c) for c in text.split(","))
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--nprocs: {text!r} is not a list of positive rank counts")
    return counts


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m infra.zygote", description=__doc__.splitlines()[0])
    p.add_argument("--nprocs", type=_counts, required=True, help="every agent's rank count, in rank order")
    p.add_argument("--agent", type=int, default=0, help="this agent's index in --nprocs")
    p.add_argument("--master-addr", default="127.0.0.1", help="agent 0's address (its launcher hosts the store)")
    p.add_argument("--master-port", type=int, default=0, help="the store's port; 0: a free one (one agent only)")
    p.add_argument("-m", dest="module", required=True, help="the ranks' module, run as __main__; its arguments follow")
    # Everything after `-m MODULE` is the module's, options included, as with `python -m`.
    at = argv.index("-m") + 2 if "-m" in argv else len(argv)
    args = p.parse_args(argv[:at])
    args.args = argv[at:]
    if not 0 <= args.agent < len(args.nprocs):
        p.error(f"--agent: {args.agent} is not an index of --nprocs ({len(args.nprocs)} agents)")
    if args.master_port == 0 and len(args.nprocs) > 1:
        p.error("--master-port: a job of several agents needs the port agent 0's store listens on")
    return args


def _preload(module: str | None) -> None:
    """Import what every rank imports, once. A module that cannot be imported here is left to
    the ranks, which then fail on it with their own traceback."""
    import torch._dynamo  # noqa: F401  (an optimizer's construction imports it: 1.5 s a rank)
    import torch.distributed  # noqa: F401  (every rank's process group)
    import torch.distributed.rendezvous  # noqa: F401

    if module is None:
        return
    try:
        importlib.import_module(module)
    except BaseException:  # noqa: BLE001  (the rank reports it, as its own failure)
        pass


def _leave(code: int) -> None:
    """End a forked rank as an interpreter ends."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads, as at exit
        atexit._run_exitfuncs()
    finally:
        leave_now(code)


def _rank(module: str, args: list[str], env: dict[str, str], port_fd: int, launcher: int) -> None:
    """A forked rank: wait for the store's port, then run the module; never returns."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    die_with_parent(launcher)
    # A fork keeps its agent's command line and, in /proc/PID/environ, its environment: the
    # name is what tells ranks apart (ps, top, psutil's name()).
    name_this_process(f"rank-{env['RANK']}")
    port = os.read(port_fd, 32).decode().strip()
    os.close(port_fd)
    if not port:  # the launcher died before its store was up
        os._exit(1)
    os.environ.update(env, MASTER_PORT=port)
    sys.argv = [module, *args]
    sys.modules.pop(module, None)  # run afresh as __main__, as `python -m` does (its imports are warm)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as err:
        code = exit_code(err)
    except BaseException:  # noqa: BLE001  (a rank's traceback, as the interpreter prints it)
        traceback.print_exc()
        code = 1
    _leave(code)


def _signal_name(code: int) -> str:
    try:
        return f" ({signal.Signals(-code).name})" if code < 0 else ""
    except ValueError:
        return ""


class Ranks:
    """This agent's forked ranks, watched until they have all exited."""

    def __init__(self, world: World, module: str, launcher: str = "forked") -> None:
        self.world, self.module, self.launcher = world, module, launcher
        self.pids: dict[int, int] = {}  # pid -> local rank
        self.codes: dict[int, int] = {}  # local rank -> exit code
        self.failed: list[int] = []  # local ranks, in the order they failed

    def fork(self, args: list[str], master_addr: str) -> list[int]:
        """Fork every rank; returns the pipes on which each waits for the store's port."""
        writers: list[int] = []
        me = os.getpid()
        for local in range(self.world.local):
            r, w = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for fd in (*writers, w):
                    os.close(fd)
                try:
                    env = self.world.env(local, master_addr, 0) | {"DDLBENCH_LAUNCHER": self.launcher}
                    _rank(self.module, args, env, r, me)
                finally:
                    os._exit(1)
            os.close(r)
            writers.append(w)
            self.pids[pid] = local
        return writers

    def describe(self) -> str:
        """Each rank's number and pid, for the job's log: `0 (pid 123), 1 (pid 124)`."""
        return ", ".join(f"{self.world.first + local} (pid {pid})" for pid, local in self.pids.items())

    def _reap(self, block: bool) -> bool:
        """Collect exited ranks; True if one was collected."""
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0 or pid not in self.pids:
            return pid != 0
        local, code = self.pids[pid], os.waitstatus_to_exitcode(status)
        self.codes[local] = code
        if code != 0:
            self.failed.append(local)
            rank = self.world.first + local
            print(f"[infra.zygote] rank {rank} failed (exitcode: {code}) local_rank: {local} (pid: {pid}) "
                  f"of module {self.module}{_signal_name(code)}", flush=True)
        return True

    def _alive(self) -> list[int]:
        return [pid for pid, local in self.pids.items() if local not in self.codes]

    def _signal(self, sig: int) -> None:
        for pid in self._alive():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def watch(self) -> int:
        """Wait for every rank; stop the others at the first failure. The launcher's status."""
        while self._alive():
            if self.failed:
                print(f"[infra.zygote] closing signal SIGTERM to ranks of pids {self._alive()}", flush=True)
                self._signal(signal.SIGTERM)
                deadline = time.monotonic() + STOP_GRACE_S
                while self._alive() and time.monotonic() < deadline:
                    if not self._reap(block=False):
                        time.sleep(POLL_S)
                self._signal(signal.SIGKILL)
                while self._alive() and self._reap(block=True):
                    pass
                break
            if not self._reap(block=False):
                time.sleep(POLL_S)
        if not self.failed:
            return 0
        self._summary()
        return 1

    def _summary(self) -> None:
        """torchrun's failure summary (infra/base.py's failed_ranks_from_log reads it)."""
        lines = ["[infra.zygote] the job failed", "Failures:"]
        for local in self.failed:
            lines += [f"  rank      : {self.world.first + local} (local_rank: {local})",
                      f"  exitcode  : {self.codes[local]}{_signal_name(self.codes[local])}"]
        print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None, launcher: str = "forked") -> int:
    """One agent's job; `launcher` (forked, or warm: by a warm server) is what its ranks see in
    DDLBENCH_LAUNCHER (torchrun's see none), and the job's summary records."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    world = World(args.nprocs, args.agent)
    _preload(args.module)
    ranks = Ranks(world, args.module, launcher)
    writers = ranks.fork(args.args, args.master_addr)
    port, store = args.master_port, None
    try:
        if world.agent == 0:  # the job's store, outliving any rank, as torchrun's agent hosts it
            from datetime import timedelta

            from torch.distributed import TCPStore

            store = TCPStore(args.master_addr, args.master_port, None, True, timedelta(seconds=300),
                             wait_for_workers=False)
            port = store.port
    except BaseException:
        ranks._signal(signal.SIGKILL)
        raise
    finally:
        for w in writers:
            try:
                os.write(w, f"{port}\n".encode())
            except OSError:
                pass
            os.close(w)
    print(f"[infra.zygote] agent {world.agent}: ranks {ranks.describe()} of {world.size} started, "
          f"the store at {args.master_addr}:{port}", flush=True)
    return ranks.watch()


def _launch(argv: list[str]) -> int:
    """`--serve SOCKET`: a warm server (infra/warm.py); `--warm=SOCKET ...`: this job's agent
    forked by that server where it can, else (and without it) the agent itself."""
    if argv[:1] == ["--serve"] and len(argv) == 2:
        return warm.serve(argv[1], _preload, lambda agent_argv: main(agent_argv, launcher="warm"))
    if argv[:1] and argv[0].startswith("--warm="):
        path, argv = argv[0].removeprefix("--warm="), argv[1:]
        code = warm.run_warm(path, argv)
        if code is not None:
            warm.exit_as(code)
    return main(argv)


if __name__ == "__main__":
    # Its ranks are reaped and its store has served them: the interpreter's teardown of torch and
    # its compiler stack would only delay the job's end.
    leave_now(_launch(sys.argv[1:]))
