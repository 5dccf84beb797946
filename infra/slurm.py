"""The `slurm` provider: torchrun agents as SLURM job steps, one `srun` per placement agent.

A job's ranks are placed on the nodes by the placement policy (infra/placement.py); every
agent (the ranks of one role on one node, in rank order) is one step, `srun --nodes=1
--ntasks=1 --overlap -w NODE torchrun --nnodes=AGENTS --node-rank=INDEX`, so nodes may run
different rank counts and ranks 0..N-1 stay workers. The first agent's node hosts torchrun's
static rendezvous. The first step to fail fails the job; the others are stopped.

Two ways to hold the nodes:
- per job (ad-hoc `ddlbench train`): one `sbatch` per job; its batch script asks SLURM for
  the nodes, devices, time and partition and starts the steps in the background. The job's
  output file is the job's log. State comes from `squeue` while the job is queued or running,
  then from `sacct` (or `scontrol`, where accounting is disabled).
- per pipeline run (`provision_shared`): one allocation job (`sleep infinity` on every node)
  held until `teardown`; its `handle()` (job id, nodes) travels to the run's other tasks,
  which `adopt` it and run each job as steps inside it (`srun --jobid=ID`) from the launcher.
Run directories must live on a file system every node shares (the same path everywhere).
A job that outlives its timeout, or whose caller is interrupted, is `scancel`ed.
`slurm_conf` names the cluster (SLURM_CONF for every command and job), e.g. the multi-node one
of scripts/services/slurm-cluster.sh; `network_interface` the interface gloo and NCCL bind.

A launcher killed outright (SIGKILL) cannot scancel: a watchdog does (infra/lifeline.py
`on_death`), at once. Every job also names its launcher in its comment (`ddlbench-launcher:`
host.pid.start), so `cancel_orphans` (the next provision, `ddlbench cleanup`) cancels the jobs
of dead launchers on this host that no watchdog did.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator

from infra import bounds
from infra.base import (
    Job,
    JobResult,
    Node,
    Provider,
    ProviderError,
    base_env,
    failed_ranks_from_log,
    launch_argv,
    launch_shell,
    run_processes,
)
from infra.lifeline import Launcher, on_death
from infra.options import SLURM_NAME, OneLine, PlacementOptions, clip, excerpt, integer_at_least, matching
from infra.placement import Agent

_TIME_RE = re.compile(r"[0-9]{1,9}|([0-9]{1,5}-)?[0-9]{1,2}(:[0-9]{2}){1,2}|[0-9]{1,5}-[0-9]{1,2}")
_COMMENT = "ddlbench-launcher:"
_ALLOCATION_COMMENT = "ddlbench-allocation:"  # held for a pipeline run: no launcher's death ends it
_IFNAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,15}(,[A-Za-z0-9_.:-]{1,15})*")
_PARTITIONS = re.compile(rf"{SLURM_NAME.pattern}(,{SLURM_NAME.pattern})*")
_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}


def _conf_env(conf: str | Path | None) -> dict[str, str]:
    """The environment of a SLURM command for the cluster of `conf` (None: the tools' default)."""
    return dict(os.environ) | ({"SLURM_CONF": str(conf)} if conf else {})


def _slurm(*argv: str, check: bool = True, conf: str | Path | None = None) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise ProviderError(
            f"slurm: `{argv[0]}` not found; install the SLURM client tools (slurm-client) or choose another provider"
        )
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=_conf_env(conf))
    if check and proc.returncode != 0:
        raise ProviderError(f"slurm: `{' '.join(argv)}` failed: {proc.stderr.strip()}")
    return proc


def controller_up(conf: str | Path | None = None) -> bool:
    """Whether the slurmctld of `conf` (default: the tools' own slurm.conf) answers `scontrol ping`."""
    if shutil.which("scontrol") is None or (conf and not Path(conf).exists()):
        return False
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=_conf_env(conf))
    return " is UP" in ping.stdout


def cancel_orphans(conf: str | Path | None = None) -> list[str]:
    """scancel this user's ddlbench jobs whose launcher ran on this host and is gone; their ids."""
    out = _slurm("squeue", "-h", "--me", "-o", "%i|%k", check=False, conf=conf).stdout
    orphans = []
    for line in out.splitlines():
        job_id, _, comment = line.strip().partition("|")
        launcher = Launcher.parse(comment.removeprefix(_COMMENT)) if comment.startswith(_COMMENT) else None
        if launcher is not None and launcher.here() and not launcher.alive():
            orphans.append(job_id)
    if orphans:
        _slurm("scancel", *orphans, check=False, conf=conf)
    return orphans


class SlurmOptions(PlacementOptions):
    nodes: Annotated[int, integer_at_least(1, most=bounds.NODES)] = Field(
        1, description="Nodes of every job (sbatch --nodes).")
    gpus_per_node: Annotated[int, integer_at_least(0, most=bounds.GPUS_PER_NODE)] = Field(
        0, description="GPUs per node (--gpus-per-node).")
    time_limit: str | int = Field("30", description="Job time limit: minutes or [D-]HH:MM:SS.")
    partition: Annotated[str | None, matching(_PARTITIONS, "SLURM partition names (letters, digits, '_.+-'; "
                                                           "a comma-separated list)")] = Field(
        None, description="SLURM partition; default: the cluster's default."
    )
    account: Annotated[str | None, matching(SLURM_NAME, "a SLURM account name (letters, digits, '_.+-')")] = Field(
        None, description="SLURM account to charge."
    )
    cpus_per_node: Annotated[int | None, integer_at_least(1, "a positive integer", optional=True,
                                                          most=bounds.CPUS_PER_NODE)] = Field(
        None, description="CPUs per node (--cpus-per-task)."
    )
    shared_dir: Annotated[str | Path | None, OneLine] = Field(
        None, description="Working directory every node sees; default: the run's."
    )
    python: Annotated[str, OneLine] = Field(sys.executable, description="Python on the nodes that runs torchrun.")
    poll_s: float = Field(0.5, gt=0, le=bounds.POLL_S.limit, description="Seconds between job state polls.")
    slurm_conf: Annotated[str | Path | None, OneLine] = Field(
        None, description="The cluster's slurm.conf (SLURM_CONF for every SLURM command and job); default: the "
        "SLURM tools' own. scripts/services/slurm-cluster.sh's multi-node cluster: /etc/slurm-multi/slurm.conf."
    )
    network_interface: str | None = Field(
        None, description="The nodes' interface for gloo and NCCL traffic (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME), "
        "e.g. eth0; default: what they pick from the host name."
    )
    queue_timeout_s: float = Field(
        600, gt=0, le=bounds.JOB_TIMEOUT_S.limit, description="Seconds a run's allocation may wait in the queue.")

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, str | int) or not _TIME_RE.fullmatch(str(v)):
            raise ValueError(f"expected minutes or [D-]HH:MM:SS, got {excerpt(v)}")
        return v

    @field_validator("slurm_conf")
    @classmethod
    def _conf(cls, v: str | Path | None) -> str | Path | None:
        if v is not None and not Path(v).is_file():
            raise ValueError(f"{clip(str(v))} is not a file (start the cluster: scripts/services/slurm-cluster.sh)")
        return v

    @field_validator("network_interface")
    @classmethod
    def _ifname(cls, v: str | None) -> str | None:
        if v is not None and not _IFNAME_RE.fullmatch(v):
            raise ValueError(f"expected an interface name such as eth0 (or a comma-separated list), got {excerpt(v)}")
        return v


class SlurmProvider(Provider):
    """Jobs as SLURM job steps on `nodes` nodes, one step per torchrun agent of the job's placement."""

    name = "slurm"
    options_model = SlurmOptions

    def __init__(self, **options: Any) -> None:
        self.options = opts = SlurmOptions.parse(options)
        self.nodes = opts.nodes
        self.gpus_per_node = opts.gpus_per_node
        self.time_limit = str(opts.time_limit)
        self.partition = opts.partition
        self.account = opts.account
        self.cpus_per_node = opts.cpus_per_node
        self.shared_dir = Path(opts.shared_dir) if opts.shared_dir else None
        self.python = opts.python
        self.threads = opts.threads_per_process
        self.poll_s = opts.poll_s
        self.slurm_conf = str(opts.slurm_conf) if opts.slurm_conf else None
        self.network_interface = opts.network_interface
        self.last_job_id: str | None = None
        self.allocation: str | None = None  # the job id of the run's allocation, when one is held
        self._active: set[str] = set()
        self._nodes: list[Node] = []

    def _cmd(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return _slurm(*argv, check=check, conf=self.slurm_conf)

    def _job_env(self) -> dict[str, str]:
        """What every rank's environment adds: the cluster's config, the interface to bind."""
        env = {"SLURM_CONF": self.slurm_conf} if self.slurm_conf else {}
        if self.network_interface:
            env |= {"GLOO_SOCKET_IFNAME": self.network_interface, "NCCL_SOCKET_IFNAME": self.network_interface}
        return env

    def provision(self) -> list[Node]:
        """Check the controller and the partition; SLURM picks the actual nodes at submission."""
        if self._nodes:
            return self._nodes
        if not controller_up(self.slurm_conf):
            self._cmd("scontrol", "ping", check=False)
            raise ProviderError(
                "slurm: slurmctld does not answer `scontrol ping`"
                + (f" (SLURM_CONF={self.slurm_conf})" if self.slurm_conf else "")
                + "; start the cluster (scripts/services/slurm.sh for a single-node one, "
                "scripts/services/slurm-cluster.sh for a multi-node one)"
            )
        where_argv = ["-p", self.partition] if self.partition else []
        argv = ["sinfo", "-h", "-N", "-o", "%N", *where_argv]
        names = list(dict.fromkeys(self._cmd(*argv).stdout.split()))
        where = f"partition {self.partition!r}" if self.partition else "the default partitions"
        if len(names) < self.nodes:
            raise ProviderError(f"provider.options.nodes: {self.nodes} nodes requested, {where} has {len(names)}")
        self._nodes = [Node(n, n) for n in names[: self.nodes]]
        cancel_orphans(self.slurm_conf)
        return self._nodes

    def _resources(self) -> list[str]:
        """The sbatch options of the nodes a job (or a run's allocation) holds."""
        out = [f"--nodes={self.nodes}", "--ntasks-per-node=1", f"--time={self.time_limit}"]
        if self.partition:
            out.append(f"--partition={self.partition}")
        if self.account:
            out.append(f"--account={self.account}")
        if self.gpus_per_node:
            out.append(f"--gpus-per-node={self.gpus_per_node}")
        if self.cpus_per_node:
            out.append(f"--cpus-per-task={self.cpus_per_node}")
        return out

    def _step_options(self, agent: Agent) -> list[str]:
        """srun's options of one agent's step: one task on its node, sharing the node's resources
        with the node's other agents (a colocated shard beside the workers); a worker agent gets
        one GPU per rank (LOCAL_RANK picks its own)."""
        out = ["--nodes=1", "--ntasks=1", "--overlap"]
        if self.gpus_per_node and agent.role == "worker":
            out.append(f"--gres=gpu:{agent.nproc}")
        return out

    def batch_script(self, job: Job) -> str:
        """The sbatch script of a job (its #SBATCH lines carry every resource request): one
        background step per torchrun agent of the job's placement, then the first failure's status."""
        placement = self.place_job(job)
        agents, nprocs = placement.agents(), placement.nprocs()
        directives = [
            _job_name(job),
            *self._resources(),
            f"--output={_directive_value('the job log path', str(job.log_path.resolve()))}",
            "--open-mode=append",
            f"--comment={_directive_value('the launcher tag', _COMMENT + Launcher.this().tag())}",
        ]
        lines = [
            "#!/bin/bash",
            *(f"#SBATCH {d}" for d in directives),
            *(f"export {k}={shlex.quote(v)}" for k, v in self._job_env().items()),
            "# Placement node i is the allocation's i-th node; the first agent's node hosts the",
            "# rendezvous, on one port per job id.",
            'mapfile -t DDLBENCH_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
            f'DDLBENCH_MASTER_ADDR=${{DDLBENCH_NODES[{agents[0].node}]}}',
            "DDLBENCH_MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
            "export DDLBENCH_MASTER_ADDR DDLBENCH_MASTER_PORT",
            "# One step per torchrun agent, in rank order: --node-rank is the agent's index.",
        ]
        for i, agent in enumerate(agents):
            launcher = launch_shell(nprocs, job.module, job.args, str(i),
                                    '"$DDLBENCH_MASTER_ADDR"', '"$DDLBENCH_MASTER_PORT"', self.python,
                                    max_restarts=job.max_restarts)
            step = " ".join(self._step_options(agent))
            lines.append(f'srun {step} --nodelist="${{DDLBENCH_NODES[{agent.node}]}}" {launcher} &')
        lines += [
            "# The first step to fail fails the job; the other steps are stopped.",
            "status=0",
            f"for _ in {' '.join(str(i) for i in range(len(agents)))}; do",
            "  wait -n && continue",
            "  code=$?",
            '  [ "$status" -ne 0 ] || { status=$code; kill $(jobs -p) 2>/dev/null; }',
            "done",
            'exit "$status"',
        ]
        return "\n".join(lines) + "\n"

    def provision_shared(self, owner: int | None = None) -> list[Node]:
        """Hold the run's nodes in one allocation job until `teardown`; the jobs of every task that
        `adopt`s its `handle()` run as steps inside it. `owner`: a process whose death releases it
        (its comment names it as the launcher, for `cancel_orphans`); None: teardown, or its
        time limit, does."""
        self.provision()
        if self.allocation is None:
            self.allocation = self._allocate(owner)
        return self._nodes

    def _allocate(self, owner: int | None) -> str:
        if owner is None:
            comment = _ALLOCATION_COMMENT + Launcher.this().tag()
        else:
            comment = _COMMENT + Launcher.of(owner).tag()
        argv = ["sbatch", "--parsable", "--job-name=ddlbench-allocation", *self._resources(), "--output=/dev/null",
                f"--comment={comment}", "--wrap=exec sleep infinity"]
        proc = self._cmd(*argv, check=False)
        if proc.returncode != 0:
            raise ProviderError(f"slurm: sbatch refused the run's allocation: {proc.stderr.strip()}")
        job_id = proc.stdout.strip().split(";")[0]
        deadline = time.monotonic() + self.options.queue_timeout_s
        try:
            while (state := self.queue_state(job_id)) != "RUNNING":
                if state not in _ACTIVE:
                    raise ProviderError(f"slurm: the run's allocation (job {job_id}) ended before it ran "
                                        f"({state or 'it left the queue'})")
                if time.monotonic() > deadline:
                    raise ProviderError(f"slurm: the run's allocation (job {job_id}) is still {state} after "
                                        f"{self.options.queue_timeout_s:g} s (provider.options.queue_timeout_s)")
                time.sleep(self.poll_s)
        except BaseException:  # interrupted too: an allocation nobody holds must not stay queued
            self.cancel(job_id)
            raise
        listed = self._cmd("squeue", "-h", "-j", job_id, "-o", "%N").stdout.strip()
        names = self._cmd("scontrol", "show", "hostnames", listed).stdout.split()
        self._nodes = [Node(n, n) for n in names]
        return job_id

    def handle(self) -> dict[str, Any]:
        """The run's allocation: {"job_id", "nodes"} (node names in placement order); {} without one."""
        if self.allocation is None:
            return {}
        return {"job_id": self.allocation, "nodes": [n.name for n in self._nodes]}

    def adopt(self, handle: dict[str, Any]) -> None:
        """Run every job as steps inside the allocation another process holds (its `handle()`)."""
        if not handle:
            return
        job_id, names = handle.get("job_id"), handle.get("nodes")
        if not isinstance(job_id, str) or not isinstance(names, list) or len(names) != self.nodes:
            raise ProviderError(f"slurm: a cluster handle names a job_id and {self.nodes} nodes, got {handle!r}")
        if (state := self.queue_state(job_id)) != "RUNNING":
            raise ProviderError(f"slurm: the run's allocation (job {job_id}) is {state or 'gone'}, not RUNNING; "
                                "its pipeline run must provision again")
        self.allocation = job_id
        self._nodes = [Node(n, n) for n in names]

    def run(self, job: Job, echo: bool = True) -> JobResult:
        if self.allocation is not None:
            return self._run_steps(job, echo)
        return self._run_batch(job, echo)

    def _run_steps(self, job: Job, echo: bool) -> JobResult:
        """The job as steps of the run's allocation, one `srun --jobid` per agent from here."""
        placement = self.place_job(job)
        agents, nprocs = placement.agents(), placement.nprocs()
        master = self._nodes[agents[0].node].address
        port = 20000 + secrets.randbelow(20000)  # steps of one allocation may run side by side
        argvs = []
        for i, agent in enumerate(agents):
            launcher = launch_argv(nprocs, i, master, port, max_restarts=job.max_restarts)
            argvs.append(["srun", f"--jobid={self.allocation}", *self._step_options(agent),
                          f"--nodelist={self._nodes[agent.node].name}", _job_name(job),
                          self.python, *launcher[1:], "-m", job.module, *job.args])
        env = base_env(self.threads) | job.env | self._job_env()
        return run_processes(argvs, [env] * len(argvs), job.log_path, job.timeout_s, echo,
                             fail_fast=job.max_restarts == 0, cancel=job.cancel)

    def _run_batch(self, job: Job, echo: bool) -> JobResult:
        """The job as a batch job of its own: sbatch, then poll its state and its output file."""
        script = self.batch_script(job)
        self.provision()
        workdir = self.shared_dir or job.log_path.parent
        workdir.mkdir(parents=True, exist_ok=True)
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        job.log_path.write_text("")
        script_path = workdir / f"ddlbench-{uuid.uuid4().hex[:8]}.sbatch"
        script_path.write_text(script)
        env = base_env(self.threads) | job.env | self._job_env()
        proc = subprocess.run(["sbatch", "--parsable", str(script_path)], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise ProviderError(f"slurm: sbatch refused the job: {proc.stderr.strip()}")
        job_id = proc.stdout.strip().split(";")[0]
        self.last_job_id = job_id
        self._active.add(job_id)
        start = time.monotonic()
        timed_out = cancelled = False
        offset = 0
        try:
            with on_death(["scancel", job_id]):  # the launcher killed outright: its watchdog cancels
                while (state := self.queue_state(job_id)) in _ACTIVE:
                    offset = _echo_new(job.log_path, offset, echo)
                    if job.cancel.is_set():
                        cancelled = True
                        self.cancel(job_id)
                        break
                    if job.timeout_s is not None and time.monotonic() - start > job.timeout_s:
                        timed_out = True
                        self.cancel(job_id)
                        break
                    time.sleep(self.poll_s)
        finally:
            if job_id in self._active and self.queue_state(job_id) in _ACTIVE:
                self.cancel(job_id)
        self._active.discard(job_id)
        _echo_new(job.log_path, offset, echo)
        state, rc = self.final_state(job_id)
        if state != "COMPLETED" and rc == 0:
            rc = 124 if timed_out or state == "TIMEOUT" else 1
        text = job.log_path.read_text(errors="replace")
        return JobResult(
            rc,
            time.monotonic() - start,
            job.log_path,
            failed_ranks_from_log(text) if rc else [],
            timed_out or state == "TIMEOUT",
            cancelled=cancelled,
        )

    def queue_state(self, job_id: str) -> str | None:
        """PENDING, RUNNING, ... while squeue lists the job; None once it left the queue."""
        out = self._cmd("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.split()
        return out[0] if out else None

    def final_state(self, job_id: str) -> tuple[str, int]:
        """(state, exit code) of a finished job: sacct, or scontrol where accounting is off."""
        acct = self._cmd("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode", check=False)
        fields = acct.stdout.strip().splitlines()[0].split("|") if acct.stdout.strip() else []
        if acct.returncode != 0 or len(fields) != 2:
            info = self._cmd("scontrol", "show", "job", "-o", job_id, check=False).stdout
            state_m, code_m = re.search(r"JobState=(\S+)", info), re.search(r"ExitCode=(\S+)", info)
            if not state_m or not code_m:
                raise ProviderError(f"slurm: job {job_id} is known to neither sacct nor scontrol")
            fields = [state_m.group(1), code_m.group(1)]
        # sacct writes "CANCELLED by 0"; ExitCode is "code:signal"
        state = fields[0].split()[0]
        code, _, sig = fields[1].partition(":")
        return state, int(code) or (128 + int(sig) if sig and int(sig) else 0)

    def cancel(self, job_id: str) -> None:
        """scancel, then wait (bounded) until the job has left the queue."""
        self._cmd("scancel", job_id, check=False)
        deadline = time.monotonic() + 30
        while self.queue_state(job_id) in _ACTIVE and time.monotonic() < deadline:
            time.sleep(0.2)
        self._active.discard(job_id)

    def teardown(self) -> None:
        """Cancel this provider's running jobs and the run's allocation (once adopted too)."""
        for job_id in list(self._active):
            self.cancel(job_id)
        if self.allocation is not None:
            self.cancel(self.allocation)
            self.allocation = None
        self._nodes = []


def _job_name(job: Job) -> str:
    name = f"ddlbench-{job.module.rsplit('.', 1)[-1]}"
    if not SLURM_NAME.fullmatch(name):
        raise ProviderError(f"slurm: job module {excerpt(job.module)} does not make a SLURM job name")
    return f"--job-name={name}"


def _directive_value(what: str, value: str) -> str:
    """`value` as sbatch reads it on an #SBATCH line: that line is the value's only line, so a
    line break is refused (it would end the directives and start a command); sbatch splits
    at white space outside double quotes and reads backslashes and quotes its own way, so those
    are refused and white space is quoted."""
    if re.search(r'[\x00-\x1f\x7f"\'\\]', value):
        raise ProviderError(f"slurm: {what} holds a line break, a control character, a quote or a backslash: "
                            f"{excerpt(value)}")
    return f'"{value}"' if re.search(r"[\s#]", value) else value


def _echo_new(path: Path, offset: int, echo: bool) -> int:
    """Print what the job appended to its output file since `offset`; return the new offset."""
    if not path.exists():
        return offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    if echo and data:
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(data)
