"""The `slurm` provider: one `sbatch` allocation per job, `srun` starts torchrun on every node.

The batch script asks SLURM for the nodes, devices, time and partition; inside it, node 0 of
the allocation hosts torchrun's static rendezvous and every node learns its rank from
`$SLURM_NODEID`. The job's output file is the job's log; run directories must live on a file
system every node shares (the same path everywhere). State comes from `squeue` while the job
is queued or running, then from `sacct` (or `scontrol`, where accounting is disabled).
A job that outlives its timeout, or whose caller is interrupted, is `scancel`ed.

A launcher killed outright (SIGKILL) cannot scancel: a watchdog does (infra/lifeline.py
`on_death`), at once. Every job also names its launcher in its comment (`ddlbench-launcher:`
host.pid.start), so `cancel_orphans` (the next provision, `ddlbench cleanup`) cancels the jobs
of dead launchers on this host that no watchdog did.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator

from infra.base import (
    Job,
    JobResult,
    Node,
    Provider,
    ProviderError,
    base_env,
    failed_ranks_from_log,
    torchrun_shell,
)
from infra.lifeline import Launcher, on_death
from infra.options import PlacementOptions, integer_at_least

_TIME_RE = re.compile(r"^\d+$|^(\d+-)?\d{1,2}(:\d{2}){1,2}$|^\d+-\d{1,2}$")
_COMMENT = "ddlbench-launcher:"
_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}


def _slurm(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise ProviderError(
            f"slurm: `{argv[0]}` not found; install the SLURM client tools (slurm-client) or choose another provider"
        )
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ProviderError(f"slurm: `{' '.join(argv)}` failed: {proc.stderr.strip()}")
    return proc


def controller_up() -> bool:
    """Whether slurmctld answers (`scontrol ping`)."""
    if shutil.which("scontrol") is None:
        return False
    return " is UP" in subprocess.run(["scontrol", "ping"], capture_output=True, text=True).stdout


def cancel_orphans() -> list[str]:
    """scancel this user's ddlbench jobs whose launcher ran on this host and is gone; their ids."""
    out = _slurm("squeue", "-h", "--me", "-o", "%i|%k", check=False).stdout
    orphans = []
    for line in out.splitlines():
        job_id, _, comment = line.strip().partition("|")
        launcher = Launcher.parse(comment.removeprefix(_COMMENT)) if comment.startswith(_COMMENT) else None
        if launcher is not None and launcher.here() and not launcher.alive():
            orphans.append(job_id)
    if orphans:
        _slurm("scancel", *orphans, check=False)
    return orphans


class SlurmOptions(PlacementOptions):
    nodes: Annotated[int, integer_at_least(1)] = Field(1, description="Nodes of every job (sbatch --nodes).")
    gpus_per_node: Annotated[int, integer_at_least(0)] = Field(0, description="GPUs per node (--gpus-per-node).")
    time_limit: str | int = Field("30", description="Job time limit: minutes or [D-]HH:MM:SS.")
    partition: str | None = Field(None, description="SLURM partition; default: the cluster's default.")
    account: str | None = Field(None, description="SLURM account to charge.")
    cpus_per_node: Annotated[int | None, integer_at_least(1, "a positive integer", optional=True)] = Field(
        None, description="CPUs per node (--cpus-per-task)."
    )
    shared_dir: str | Path | None = Field(None, description="Working directory every node sees; default: the run's.")
    python: str = Field(sys.executable, description="Python on the nodes that runs torchrun.")
    threads_per_process: int = Field(1, description="Threads per rank (OMP_NUM_THREADS, torch threads).")
    poll_s: float = Field(0.5, description="Seconds between job state polls.")

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit(cls, v: Any) -> Any:
        if not _TIME_RE.match(str(v)):
            raise ValueError(f"expected minutes or [D-]HH:MM:SS, got {v!r}")
        return v


class SlurmProvider(Provider):
    """Jobs as SLURM batch jobs: `nodes` nodes, world_size / nodes ranks per node."""

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
        self.last_job_id: str | None = None
        self._active: set[str] = set()
        self._nodes: list[Node] = []

    def provision(self) -> list[Node]:
        """Check the controller and the partition; SLURM picks the actual nodes at submission."""
        if self._nodes:
            return self._nodes
        if not controller_up():
            _slurm("scontrol", "ping", check=False)
            raise ProviderError(
                "slurm: slurmctld does not answer `scontrol ping`; start the "
                "cluster (scripts/services/slurm.sh for a single-node one)"
            )
        where_argv = ["-p", self.partition] if self.partition else []
        argv = ["sinfo", "-h", "-N", "-o", "%N", *where_argv]
        names = list(dict.fromkeys(_slurm(*argv).stdout.split()))
        where = f"partition {self.partition!r}" if self.partition else "the default partitions"
        if len(names) < self.nodes:
            raise ProviderError(f"provider.options.nodes: {self.nodes} nodes requested, {where} has {len(names)}")
        self._nodes = [Node(n, n) for n in names[: self.nodes]]
        cancel_orphans()
        return self._nodes

    def batch_script(self, job: Job) -> str:
        """The sbatch script of a job (its #SBATCH lines carry every resource request)."""
        per_node = self.uniform_ranks_per_node(job)
        directives = [
            f"--job-name=ddlbench-{job.module.rsplit('.', 1)[-1]}",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            f"--time={self.time_limit}",
            f"--output={job.log_path.resolve()}",
            "--open-mode=append",
            f"--comment={_COMMENT}{Launcher.this().tag()}",
        ]
        if self.partition:
            directives.append(f"--partition={self.partition}")
        if self.account:
            directives.append(f"--account={self.account}")
        if self.gpus_per_node:
            directives.append(f"--gpus-per-node={self.gpus_per_node}")
        if self.cpus_per_node:
            directives.append(f"--cpus-per-task={self.cpus_per_node}")
        torchrun = torchrun_shell(
            per_node,
            self.nodes,
            job.module,
            job.args,
            '"$SLURM_NODEID"',
            '"$DDLBENCH_MASTER_ADDR"',
            '"$DDLBENCH_MASTER_PORT"',
            self.python,
            max_restarts=job.max_restarts,
        )
        srun = "exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c"
        lines = [
            "#!/bin/bash",
            *(f"#SBATCH {d}" for d in directives),
            "# Rendezvous on the allocation's first node; one port per job id.",
            'DDLBENCH_MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
            "DDLBENCH_MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
            "export DDLBENCH_MASTER_ADDR DDLBENCH_MASTER_PORT",
            f"{srun} {shlex.quote(torchrun)}",
        ]
        return "\n".join(lines) + "\n"

    def run(self, job: Job, echo: bool = True) -> JobResult:
        script = self.batch_script(job)
        self.provision()
        workdir = self.shared_dir or job.log_path.parent
        workdir.mkdir(parents=True, exist_ok=True)
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        job.log_path.write_text("")
        script_path = workdir / f"ddlbench-{uuid.uuid4().hex[:8]}.sbatch"
        script_path.write_text(script)
        env = base_env(self.threads) | job.env
        proc = subprocess.run(["sbatch", "--parsable", str(script_path)], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise ProviderError(f"slurm: sbatch refused the job: {proc.stderr.strip()}")
        job_id = proc.stdout.strip().split(";")[0]
        self.last_job_id = job_id
        self._active.add(job_id)
        start = time.monotonic()
        timed_out = False
        offset = 0
        try:
            with on_death(["scancel", job_id]):  # the launcher killed outright: its watchdog cancels
                while (state := self.queue_state(job_id)) in _ACTIVE:
                    offset = _echo_new(job.log_path, offset, echo)
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
        )

    def queue_state(self, job_id: str) -> str | None:
        """PENDING, RUNNING, ... while squeue lists the job; None once it left the queue."""
        out = _slurm("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.split()
        return out[0] if out else None

    def final_state(self, job_id: str) -> tuple[str, int]:
        """(state, exit code) of a finished job: sacct, or scontrol where accounting is off."""
        acct = _slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode", check=False)
        fields = acct.stdout.strip().splitlines()[0].split("|") if acct.stdout.strip() else []
        if acct.returncode != 0 or len(fields) != 2:
            info = _slurm("scontrol", "show", "job", "-o", job_id, check=False).stdout
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
        _slurm("scancel", job_id, check=False)
        deadline = time.monotonic() + 30
        while self.queue_state(job_id) in _ACTIVE and time.monotonic() < deadline:
            time.sleep(0.2)
        self._active.discard(job_id)

    def teardown(self) -> None:
        for job_id in list(self._active):
            self.cancel(job_id)
        self._nodes = []


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
