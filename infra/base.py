"""The cluster-provider interface (DESIGN §5).

A provider provisions nodes, launches one launcher per placement agent for a job
(infra/zygote.py, or torchrun for a job with restarts), streams its logs, waits with a
timeout, and always tears down. Commands are argument lists, never shell strings built
from input.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

import psutil

from infra import bounds
from infra.placement import Placement, PlacementError, Policy, place

if TYPE_CHECKING:
    from infra.node_usage import NodeUsage
    from infra.options import ProviderOptions


class ProviderError(RuntimeError):
    """A provider could not provision, launch or tear down."""


@dataclass(frozen=True)
class Node:
    name: str
    address: str


@dataclass
class Job:
    """A distributed job: `python -m module *args` on `world_size` ranks, the last `servers`
    of them parameter-server shards (placed by the provider's policy, infra/placement.py)."""

    module: str
    args: list[str]
    world_size: int
    log_path: Path
    servers: int = 0
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    max_restarts: int = 0  # torchrun restarts every rank of a failed job this many times
    # Set while the job runs, it ends the job now (its launcher saw a rank stop, training/heartbeat.py).
    cancel: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)


@dataclass
class JobResult:
    returncode: int
    duration_s: float
    log_path: Path
    failed_ranks: list[dict] = field(default_factory=list)
    timed_out: bool = False
    causes: list[str] = field(default_factory=list)  # what the failed ranks said they were doing
    cancelled: bool = False  # ended by its Job's `cancel`

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe_failure(self) -> str:
        if self.timed_out:
            return f"the job ran past its timeout and was killed (log: {self.log_path})"
        if self.cancelled:  # the ranks' exits are ours: only what they said counts
            return "; ".join(["the launcher ended the job", *self.causes]) + f" (log: {self.log_path})"
        if self.failed_ranks:
            parts = [f"rank {f['rank']} exited with {f['exitcode']}" + (f" ({f['signal']})" if f.get("signal") else "")
                     for f in self.failed_ranks]
            return "; ".join(parts + self.causes) + f" (log: {self.log_path})"
        return "; ".join([f"the job exited with status {self.returncode}", *self.causes]) + f" (log: {self.log_path})"


def failed_ranks_from_log(text: str) -> list[dict]:
    """The failure summary (torchrun's, or infra/zygote.py's in its format) names each failed
    rank and its exit code; without it (the job was ended early), the agent's 'failed
    (exitcode ...)' lines do.

    Every failed rank is listed, the ones the agent stopped (SIGTERM) last: torchrun's
    "root cause" is the earliest timestamp, and a rank that raised on a dead peer's
    connection reports before the agent notices the peer killed outright."""
    marker = text.rfind("Failures:")
    marker = marker if marker >= 0 else text.rfind("Root Cause")
    section = text[marker:] if marker >= 0 else ""
    found = [(int(m.group(1)), int(m.group(2))) for m in
             re.finditer(r"rank\s*:\s*(\d+)\s*\(local_rank.*?\)\s*\n\s*exitcode\s*:\s*(-?\d+)", section)]
    if not found:  # infra/zygote.py's own lines name global ranks
        found = [(int(m.group(1)), int(m.group(2))) for m in _FORKED_RANK_FAILED.finditer(text)]
    if not found:  # torchrun's agent's lines give local ranks: the global ones only on one node
        found = [(int(m.group(2)), int(m.group(1))) for m in _RANK_FAILED.finditer(text)]
    first: dict[int, int] = {}
    for rank, code in found:
        first.setdefault(rank, code)
    found = sorted(first.items(), key=lambda rc: rc[1] == -signal.SIGTERM)  # stable: summary order otherwise
    out = []
    for rank, code in found:
        info = {"rank": rank, "exitcode": code}
        if code < 0:
            try:
                info["signal"] = signal.Signals(-code).name
            except ValueError:
                pass
        out.append(info)
    return out


def launch_argv(nprocs: Sequence[int], agent: int = 0, master_addr: str | None = None,
                master_port: int | None = None, *, max_restarts: int = 0, warm: str | None = None) -> list[str]:
    """The launcher part of one agent's command line (the module and its arguments follow).

    `nprocs` is every agent's rank count in rank order, `agent` this one's index. A job without
    restarts is forked from one warm interpreter per agent (infra/zygote.py); one with restarts
    runs under torchrun, whose elastic agents restart every agent's ranks together. `warm`: a
    warm server's socket (infra/warm.py) to fork the agent from, where it can."""
    if max_restarts:
        return _torchrun_argv(nprocs[agent], len(nprocs), agent, master_addr, master_port, max_restarts)
    argv = [sys.executable, "-m", "infra.zygote", *([f"--warm={warm}"] if warm else []),
            f"--nprocs={','.join(str(n) for n in nprocs)}", f"--agent={agent}"]
    if master_addr is not None:
        argv.append(f"--master-addr={master_addr}")
    if master_port is not None:
        argv.append(f"--master-port={master_port}")
    return argv


def _torchrun_argv(nproc_per_node: int, nnodes: int, node_rank: int, master_addr: str | None,
                   master_port: int | None, max_restarts: int) -> list[str]:
    """torchrun's part of a command line: standalone on one node, static rendezvous otherwise."""
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}",
            f"--max-restarts={max_restarts}", "--monitor-interval=0.2"]
    if nnodes == 1 and master_addr is None:
        return argv + ["--standalone", "--nnodes=1"]
    return argv + [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={master_addr}",
                   f"--master-port={master_port}"]


def launch_shell(nprocs: Sequence[int], module: str, args: list[str], agent: str, master_addr: str,
                 master_port: str, python: str = sys.executable, *, max_restarts: int = 0) -> str:
    """`launch_argv` as one shell command for a node that learns its agent index and master only
    when it runs.

    agent, master_addr and master_port are shell words expanded on the node (for example
    "$SLURM_NODEID"); every other word is quoted. Used by schedulers that start the same
    command on every node (SLURM's srun, a Kubernetes Indexed Job).
    """
    expanded = {"--node-rank": agent, "--agent": agent, "--master-addr": master_addr, "--master-port": master_port}
    words = [shlex.quote(python)]
    # torchrun takes this agent's own count: a shell word stands for an agent of a uniform placement
    index = int(agent) if agent.isdigit() else 0
    for arg in launch_argv(nprocs, index, "-", 0, max_restarts=max_restarts)[1:]:
        key = arg.split("=", 1)[0]
        words.append(f"{key}={expanded[key]}" if key in expanded else shlex.quote(arg))
    return " ".join(words + [shlex.quote(a) for a in ["-m", module, *args]])


# infra/zygote.py, when a rank dies: "[infra.zygote] rank 3 failed (exitcode: -9) local_rank: 1 ..."
_FORKED_RANK_FAILED = re.compile(r"\[infra\.zygote\] rank (\d+) failed \(exitcode: (-?\d+)\)")
# torchrun's agent, when a rank dies: "... failed (exitcode: -9) local_rank: 1 (pid: 123) of binary ..."
_RANK_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
# The agent's first words when a rank has failed: it is stopping the others.
_STOPPING = re.compile(r"closing signal SIGTERM")
_STOP_GRACE_S = 3.0  # how long the agent may take to stop the other ranks and report


def stream_process(proc: subprocess.Popen, log: IO[str], echo: bool,
                   on_line: Callable[[str], None] | None = None) -> threading.Thread:
    """Copy a process's merged output to the log (and our stdout) line by line."""

    def pump() -> None:
        assert proc.stdout is not None
        log_ok = True
        for line in proc.stdout:
            if log_ok:
                try:
                    log.write(line)
                    log.flush()
                except OSError as err:  # a full disk: keep draining, or the job blocks on its pipe
                    log_ok = False
                    sys.stderr.write(f"ddlbench: cannot write {log.name}: {err.strerror}\n")
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
            if on_line:
                on_line(line)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return t


def kill_group(proc: subprocess.Popen, grace_s: float = 2.0) -> None:
    """SIGTERM the launcher's process group (torchrun forwards it to the ranks),
    then SIGKILL whatever is left of it and of its descendants: torchrun starts
    ranks in sessions of their own, and a stopped rank never acts on SIGTERM."""
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in descendants:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def run_processes(argvs: list[list[str]], envs: list[dict[str, str]], log_path: Path,
                  timeout_s: float | None, echo: bool = True, fail_fast: bool = True,
                  cancel: threading.Event | None = None) -> JobResult:
    """Start one process group per argv, wait for all, kill all on the first failure, on the
    timeout, or once `cancel` is set.

    With `fail_fast`, the first rank failure torchrun reports ends the job at once:
    torchrun itself waits 30 s for the other ranks to stop (for ever for a stopped one).
    """
    # Imported here: `python -m infra.lifeline` imports this package first.
    from infra.lifeline import wrap as lifeline_wrap

    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    procs: list[subprocess.Popen] = []
    failed_at: list[float] = []

    def watch(line: str) -> None:
        if fail_fast and not failed_at and (_STOPPING.search(line) or _RANK_FAILED.search(line)):
            failed_at.append(time.monotonic())

    with open(log_path, "w") as log:
        pumps = []
        try:
            for argv, env in zip(argvs, envs, strict=True):
                # In a session of its own (the group is ours to kill), and dying with us (lifeline).
                p = subprocess.Popen(lifeline_wrap(argv), env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
                procs.append(p)
                pumps.append(stream_process(p, log, echo, watch))
            timed_out = cancelled = False
            while any(p.poll() is None for p in procs):
                if any(p.poll() not in (None, 0) for p in procs):
                    break
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
                if failed_at and time.monotonic() - failed_at[0] > _STOP_GRACE_S:
                    break  # a rank that ignores SIGTERM (a stopped straggler) is killed below
                if timeout_s is not None and time.monotonic() - start > timeout_s:
                    timed_out = True
                    break
                time.sleep(0.1)
        finally:
            for p in procs:
                kill_group(p)
            for t in pumps:
                t.join(5)
    codes = [p.returncode for p in procs]
    rc = next((c for c in codes if c != 0), 0)
    if timed_out and rc == 0:
        rc = 124
    if cancelled and rc == 0:
        rc = 1
    text = log_path.read_text(errors="replace")
    return JobResult(rc, time.monotonic() - start, log_path, failed_ranks_from_log(text) if rc else [], timed_out,
                     cancelled=cancelled)


class Provider(ABC):
    """Provision nodes, run jobs on them, always tear down (use as a context manager)."""

    name: str = "provider"
    # The job's processes are this process's descendants on this host, so the launcher can tell
    # their CPU time from other work's (infra/hostload.py).
    measures_host_load: bool = False
    # Every rank runs on this host (local, an emulated cluster): its memory bounds a job's ranks.
    one_host: bool = False
    nodes: int = 1
    options_model: ClassVar[type[ProviderOptions]]  # its options, built from keyword arguments
    options: ProviderOptions
    # Its agents run on this host, where a warm server can fork them (infra/warm.py).
    forks_warm: bool = False

    @abstractmethod
    def provision(self) -> list[Node]: ...

    @abstractmethod
    def run(self, job: Job, echo: bool = True) -> JobResult: ...

    @abstractmethod
    def teardown(self) -> None: ...

    def place(self, workers: int, servers: int = 0) -> Placement:
        """Where a job's ranks go on this provider's nodes, by its placement options;
        ProviderError naming the option when they cannot be placed. Checked when a spec
        loads (pipelines/spec/__init__.py), and again at launch."""
        o = self.options
        ranks, most = workers + servers, bounds.ranks_per_host()
        if self.one_host and ranks > most.limit:
            raise ProviderError(f"workers: {workers} workers + {servers} servers = {ranks} ranks on this host, above "
                                f"the bound of {most.limit} ({most.reason})")
        try:
            devices = getattr(o, "devices_per_node", None) or getattr(o, "gpus_per_node", 0) or None
            return place(workers, servers, self.nodes, getattr(o, "placement", Policy.colocated),
                         devices_per_node=devices,
                         server_nodes=getattr(o, "server_nodes", 1))
        except PlacementError as err:
            raise ProviderError(str(err)) from None

    def place_job(self, job: Job) -> Placement:
        return self.place(job.world_size - job.servers, job.servers)

    def node_usage(self) -> dict[str, NodeUsage] | None:
        """Each node's own CPU, memory and link bytes by node name (infra/node_usage.py), for
        per-node system metrics; None where the host's own metrics are the node's (one host) or
        the provider cannot read its nodes from here."""
        return None

    def provision_shared(self, owner: int | None = None) -> list[Node]:
        """Provision a cluster that outlives this process, for the other tasks of one pipeline run
        to `adopt` (its `handle()`) until one of them tears it down. `owner`: a process whose death
        releases it too (the one `ddlbench run` process); None: only `teardown()`, or a lease the
        provider keeps, does (Airflow tasks are short processes of their own). Default:
        `provision()`, for providers whose cluster needs no process of ours to stay up."""
        return self.provision()

    def handle(self) -> dict[str, Any]:
        """Small JSON naming the provisioned cluster, for another process of the same pipeline run
        to `adopt` (one cluster per pipeline run, DESIGN §5); {} when there is nothing to share."""
        return {}

    def adopt(self, handle: dict[str, Any]) -> None:
        """Use the cluster that another process provisioned (its `handle()`): `provision()` then
        returns its nodes without creating anything, `run()` runs on it, `teardown()` releases it."""
        if handle:
            raise ProviderError(f"{self.name}: cannot adopt a cluster handle ({sorted(handle)})")

    def warm_socket(self, job: Job, node: str, env: dict[str, str], prefix: list[str] | None = None) -> str | None:
        """The warm server's socket for a job's agent on `node` (`--warm=`, infra/warm.py); None:
        cold (outside `infra.warm.agents()`, or a job with restarts, which torchrun runs)."""
        # Imported here: infra.warm imports infra.lifeline, which `python -m infra.lifeline` runs.
        from infra.warm import socket_for

        return None if job.max_restarts or not self.forks_warm else socket_for(node, env, prefix)

    def __enter__(self) -> Provider:
        try:
            self.provision()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()


def base_env(threads: int = 1) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
