"""The `local` provider: every rank on this host, one launcher (infra/zygote.py) for them all."""

from __future__ import annotations

import platform
from typing import Any

from infra.base import Job, JobResult, Node, Provider, base_env, launch_argv, run_processes
from infra.options import ProviderOptions


class LocalOptions(ProviderOptions):
    """The local provider has only the options every provider has."""


class LocalProvider(Provider):
    name = "local"
    measures_host_load = True
    one_host = True
    forks_warm = True
    options_model = LocalOptions

    def __init__(self, **options: Any) -> None:
        self.options = LocalOptions.parse(options)
        self.threads = self.options.threads_per_process

    def provision(self) -> list[Node]:
        return [Node(platform.node() or "localhost", "127.0.0.1")]

    def run(self, job: Job, echo: bool = True) -> JobResult:
        self.place_job(job)  # one node: every rank here, workers first
        env = base_env(self.threads) | job.env
        argv = launch_argv([job.world_size], max_restarts=job.max_restarts, warm=self.warm_socket(job, "local", env))
        argv += ["-m", job.module, *job.args]
        return run_processes([argv], [env], job.log_path, job.timeout_s, echo, fail_fast=job.max_restarts == 0,
                             cancel=job.cancel)

    def teardown(self) -> None:
        """Nothing to release: run_processes already reaped every process group."""
