"""The `kubernetes` provider: a job's nodes as the pods of an Indexed Job, one torchrun per pod.

Per run the provider creates a headless Service and an Indexed Job with `completions =
parallelism = nodes`. Pod k gets `JOB_COMPLETION_INDEX=k` (its node rank) and, through the
Job's `subdomain`, the DNS name `<job>-k.<job>`; pod 0 hosts torchrun's static rendezvous.
GPU requests, node selectors and tolerations come from the options. The job is watched
until it completes or fails (or its timeout passes), every pod's log is collected into the
job's log file, and the Job (with its pods) and the Service are deleted.

One cluster per pipeline run (DESIGN §5), as close as the API allows: a Kubernetes cluster
outlives every process of ours and nothing of a run needs to be held between its jobs, so the
run is a label. `provision_shared` names it (`ddlbench.io/run`, the handle `{"run", "namespace"}`),
every Job and Service of the run carries it (each job is still an Indexed Job of its own, deleted
when it ends), and `teardown` of the run deletes every Job and Service that still carries it
(those of a killed task whose watchdog died too).

A launcher killed outright cannot delete its Job: its watchdog does (`python -m infra.kubernetes
delete-on-death`, started through infra/lifeline.py `watchdog`). Every Job and Service carries
its launcher (labels `ddlbench.io/launcher-host`, `ddlbench.io/launcher-pid`, and the full
identity in annotation `ddlbench.io/launcher`), so `delete_orphans` (the next provision,
`ddlbench cleanup --kubernetes`) deletes those of dead launchers on this host that no watchdog did.

Run directories are paths on a volume every pod and the submitter share: mount a
ReadWriteMany claim (`volume_claim`) at the same path as the run home (`mount_path`).
The image must hold this repository and its dependencies (infra/deploy/kubernetes/).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import time
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator

from infra import bounds
from infra.base import (
    Job,
    JobResult,
    Node,
    Provider,
    ProviderError,
    failed_ranks_from_log,
    launch_shell,
)
from infra.lifeline import Launcher, wait_for_exit, watchdog
from infra.options import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    IMAGE_REF,
    OneLine,
    PlacementOptions,
    excerpt,
    integer_at_least,
    matching,
)
from infra.placement import Placement

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
# Kubernetes' own syntax of a label key ([prefix/]name), a label value and a resource quantity.
_LABEL_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
_LABEL_KEY = re.compile(rf"({DNS_SUBDOMAIN.pattern}/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(rf"{_LABEL_NAME}?")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
JOB_LABEL = "ddlbench.io/job"
RUN_LABEL = "ddlbench.io/run"  # the pipeline run a job belongs to (one cluster per pipeline run)
LAUNCHER_HOST_LABEL = "ddlbench.io/launcher-host"
LAUNCHER_PID_LABEL = "ddlbench.io/launcher-pid"
LAUNCHER_ANNOTATION = "ddlbench.io/launcher"


def _label_value(text: str) -> str:
    """`text` as a label value: 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")


def _toleration(tol: Any) -> Any:
    if not isinstance(tol, dict) or not tol or set(tol) - _TOLERATION_KEYS:
        raise ValueError(f"expected a mapping with keys among {sorted(_TOLERATION_KEYS)}, got {excerpt(tol)}")
    return tol


def _quantity(value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not _QUANTITY.fullmatch(str(value))):
        raise ValueError(f"expected a resource quantity such as 8, 500m or 32Gi, got {excerpt(value)}")
    return value


class KubernetesOptions(PlacementOptions):
    nodes: Annotated[int, integer_at_least(1, most=bounds.NODES)] = Field(
        1, description="Pods of every job (one torchrun each).")
    image: Annotated[str, matching(IMAGE_REF, "an image reference such as registry:5000/ddlbench:1.0")] = Field(
        "ddlbench:latest", description="Container image holding this repository."
    )
    namespace: Annotated[str, matching(DNS_LABEL, "a namespace name (RFC 1123 label)")] = Field(
        "default", description="Kubernetes namespace of the Job and Service."
    )
    gpus_per_node: Annotated[int, integer_at_least(0, most=bounds.GPUS_PER_NODE)] = Field(
        0, description="nvidia.com/gpu limit per pod.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Pod node selector, label -> value.")
    tolerations: list[Annotated[dict[str, Any], BeforeValidator(_toleration)]] = Field(
        default_factory=list, description="Pod tolerations (key, operator, value, effect, tolerationSeconds)."
    )
    cpu: Annotated[str | int | None, BeforeValidator(_quantity)] = Field(
        None, description="CPU request per pod, e.g. 8 or 500m."
    )
    memory: Annotated[str | int | None, BeforeValidator(_quantity)] = Field(
        None, description="Memory request per pod, e.g. 32Gi."
    )
    volume_claim: Annotated[str | None, matching(DNS_SUBDOMAIN, "a claim name (RFC 1123 subdomain)")] = Field(
        None, description="ReadWriteMany claim holding the run directories."
    )
    mount_path: Annotated[str | None, OneLine] = Field(
        None, validate_default=True, description="Where volume_claim is mounted: the run home's path."
    )
    service_account: Annotated[
        str | None, matching(DNS_SUBDOMAIN, "a service account name (RFC 1123 subdomain)")
    ] = Field(None, description="Service account of the pods.")
    python: Annotated[str, OneLine] = Field("python", description="Python in the image that runs torchrun.")
    master_port: int = Field(29500, ge=1, le=65535, description="torchrun's static rendezvous port on pod 0.")
    name_prefix: str = Field("ddlbench", description="Prefix of the Job's name (a DNS label).")
    kubeconfig: Annotated[str | None, OneLine] = Field(
        None, description="kubeconfig file; default: in-cluster or ~/.kube/config."
    )
    context: Annotated[str | None, OneLine] = Field(None, description="kubeconfig context.")
    api_server: Annotated[str | None, OneLine] = Field(None, description="API server URL, without a kubeconfig.")
    poll_s: float = Field(2.0, gt=0, le=bounds.POLL_S.limit, description="Seconds between job state polls.")

    @field_validator("node_selector", mode="before")
    @classmethod
    def _selector(cls, v: Any) -> Any:
        selector = v or {}
        if not isinstance(selector, dict) or not all(
            isinstance(k, str) and isinstance(val, str) and _LABEL_KEY.fullmatch(k) and _LABEL_VALUE.fullmatch(val)
            for k, val in selector.items()
        ):
            raise ValueError(f"expected a mapping of label keys to label values (Kubernetes' syntax), got {excerpt(v)}")
        return selector

    @field_validator("tolerations", mode="before")
    @classmethod
    def _tolerations(cls, v: Any) -> Any:
        return v or []

    @field_validator("mount_path")
    @classmethod
    def _mount_path(cls, v: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("volume_claim") and not v:
            raise ValueError(
                "volume_claim needs the path to mount it at (the run home, the same path as on the submitter)"
            )
        if v is not None and not v.startswith("/"):
            raise ValueError(f"expected an absolute path, got {excerpt(v)}")
        return v

    @field_validator("name_prefix")
    @classmethod
    def _name_prefix(cls, v: str) -> str:
        if not _NAME_RE.fullmatch(v):
            raise ValueError(
                f"{excerpt(v)} is not a DNS label (lowercase letters, digits and '-', at most 40 characters)"
            )
        return v


class KubernetesProvider(Provider):
    """Jobs as Indexed Jobs: `nodes` pods, world_size / nodes ranks per pod."""

    name = "kubernetes"
    options_model = KubernetesOptions

    def __init__(self, **options: Any) -> None:
        self.options = opts = KubernetesOptions.parse(options)
        self.nodes = opts.nodes
        self.image = opts.image
        self.namespace = opts.namespace
        self.gpus_per_node = opts.gpus_per_node
        self.node_selector = opts.node_selector
        self.tolerations = opts.tolerations
        self.cpu, self.memory = opts.cpu, opts.memory
        self.volume_claim, self.mount_path = opts.volume_claim, opts.mount_path
        self.service_account = opts.service_account
        self.python = opts.python
        self.master_port = opts.master_port
        self.name_prefix = opts.name_prefix
        self.kubeconfig, self.context, self.api_server = opts.kubeconfig, opts.context, opts.api_server
        self.threads = opts.threads_per_process
        self.poll_s = opts.poll_s
        self.last_job_name: str | None = None
        self.run_label: str | None = None  # the pipeline run's label, when its jobs share one cluster
        self._api: Any = None
        self._created: list[tuple[str, str]] = []

    # -- objects ---------------------------------------------------------------------------

    def objects(self, job: Job, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The headless Service and the Indexed Job of a run, as Kubernetes API dicts."""
        placement = self.place_job(job)
        launcher = Launcher.this()
        labels = {"app.kubernetes.io/name": "ddlbench", JOB_LABEL: name}
        if self.run_label:
            labels[RUN_LABEL] = self.run_label
        owner = {LAUNCHER_HOST_LABEL: _label_value(launcher.host), LAUNCHER_PID_LABEL: str(launcher.pid)}
        annotations = {LAUNCHER_ANNOTATION: launcher.tag()}
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels | owner,
                "annotations": annotations,
            },
            # headless, and published before readiness: pods resolve <job>-0.<job> while starting
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {JOB_LABEL: name},
                "ports": [{"name": "rendezvous", "port": self.master_port}],
            },
        }
        command = self._pod_command(job, placement, f"{name}-0.{name}")
        env = {"OMP_NUM_THREADS": str(self.threads), "PYTHONUNBUFFERED": "1"} | job.env
        resources: dict[str, dict[str, str]] = {}
        if self.cpu:
            resources.setdefault("requests", {})["cpu"] = self.cpu
        if self.memory:
            resources.setdefault("requests", {})["memory"] = self.memory
        if self.gpus_per_node:
            # extended resources: the limit is the request
            resources["limits"] = {"nvidia.com/gpu": str(self.gpus_per_node)}
        container: dict[str, Any] = {
            "name": "torchrun",
            "image": self.image,
            "command": ["bash", "-c", command],
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "ports": [{"containerPort": self.master_port, "name": "rendezvous"}],
            "resources": resources,
        }
        pod_spec: dict[str, Any] = {"subdomain": name, "restartPolicy": "Never", "containers": [container]}
        if self.node_selector:
            pod_spec["nodeSelector"] = self.node_selector
        if self.tolerations:
            pod_spec["tolerations"] = self.tolerations
        if self.service_account:
            pod_spec["serviceAccountName"] = self.service_account
        if self.volume_claim:
            container["volumeMounts"] = [{"name": "runs", "mountPath": self.mount_path}]
            pod_spec["volumes"] = [{"name": "runs", "persistentVolumeClaim": {"claimName": self.volume_claim}}]
        job_spec: dict[str, Any] = {
            "completionMode": "Indexed",
            "completions": self.nodes,
            "parallelism": self.nodes,
            "backoffLimit": 0,  # a failed rank fails the run; torchrun does not restart either
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        }
        if job.timeout_s is not None:
            job_spec["activeDeadlineSeconds"] = max(1, int(job.timeout_s))
        k8s_job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels | owner,
                "annotations": annotations,
            },
            "spec": job_spec,
        }
        return service, k8s_job

    def _pod_command(self, job: Job, placement: Placement, master: str) -> str:
        """What pod i runs: its placement node's agents' launchers (infra/placement.py). A uniform
        placement is one launcher per pod, its agent index the pod's; otherwise each pod starts
        its node's agents (a node's workers, and its colocated shards) in the background, each
        with its agent index, and the first to fail fails the pod."""
        agents, nprocs = placement.agents(), placement.nprocs()

        def launcher(agent: str) -> str:
            return launch_shell(nprocs, job.module, job.args, agent, master, str(self.master_port),
                                self.python, max_restarts=job.max_restarts)

        if placement.uniform:
            return launcher('"$JOB_COMPLETION_INDEX"')
        lines = ['pids=""', 'case "$JOB_COMPLETION_INDEX" in']
        for node in range(self.nodes):
            mine = [f'{launcher(str(i))} & pids="$pids $!";'
                    for i, a in enumerate(agents) if a.node == node]
            lines.append(f"  {node}) " + (" ".join(mine) if mine else "exit 0;") + " ;;")
        # Each agent is waited for by the pid it started with, once it has ended: `jobs` forgets a
        # job that ended before it is asked, so `wait -n` can answer 127 ("no child") when two
        # agents end together. The first to fail ends the others.
        lines += [
            "esac",
            "status=0",
            'left="$pids "',
            'while [ -n "${left// /}" ]; do',
            "  for pid in $left; do",
            '    kill -0 "$pid" 2>/dev/null && continue',
            '    wait "$pid"; code=$?',
            '    left="${left/ $pid / }"',
            '    [ "$code" -eq 0 ] || [ "$status" -ne 0 ] || { status=$code; kill $left 2>/dev/null; }',
            "  done",
            "  sleep 0.2",
            "done",
            'exit "$status"',
        ]
        return "\n".join(lines)

    # -- API -------------------------------------------------------------------------------

    def _client(self) -> Any:
        if self._api is not None:
            return self._api
        from kubernetes import client, config

        try:
            if self.api_server:
                cfg = client.Configuration(host=self.api_server)
                api = client.ApiClient(cfg)
            elif os.environ.get("KUBERNETES_SERVICE_HOST") and not self.kubeconfig:
                config.load_incluster_config()
                api = client.ApiClient()
            else:
                api = config.new_client_from_config(config_file=self.kubeconfig, context=self.context)
        except config.ConfigException as err:
            raise ProviderError(
                f"kubernetes: no cluster to talk to ({err}); give provider.options.kubeconfig or run inside a cluster"
            ) from None
        self._api = (client.CoreV1Api(api), client.BatchV1Api(api), client.VersionApi(api))
        return self._api

    def provision(self) -> list[Node]:
        """Check the API server answers; the scheduler places the pods when a job is created."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            self._client()[2].get_code()
        except (ApiException, HTTPError, OSError) as err:
            raise ProviderError(f"kubernetes: the API server does not answer: {err}") from None
        self.delete_orphans()
        return [Node(f"index-{i}", f"<job>-{i}.<job>.{self.namespace}") for i in range(self.nodes)]

    def provision_shared(self, owner: int | None = None) -> list[Node]:
        """The run's label, for every job of the pipeline run; the API server checked."""
        nodes = self.provision()
        self.run_label = self.run_label or f"{self.name_prefix}-run-{secrets.token_hex(4)}"
        return nodes

    def handle(self) -> dict[str, Any]:
        return {"run": self.run_label, "namespace": self.namespace} if self.run_label else {}

    def adopt(self, handle: dict[str, Any]) -> None:
        if not handle:
            return
        run, namespace = handle.get("run"), handle.get("namespace")
        if not isinstance(run, str) or not run or _label_value(run) != run:
            raise ProviderError(f"kubernetes: not a kubernetes run handle: {handle}")
        if namespace != self.namespace:
            raise ProviderError(f"provider.options.namespace: the run's jobs are in {namespace!r}, "
                                f"the options give {self.namespace!r}")
        self.run_label = run

    def run(self, job: Job, echo: bool = True) -> JobResult:
        name = f"{self.name_prefix}-{secrets.token_hex(4)}"
        service, k8s_job = self.objects(job, name)
        self.provision()
        core, batch, _ = self._client()
        self.last_job_name = name
        start = time.monotonic()
        deadline = None if job.timeout_s is None else start + job.timeout_s
        # the launcher killed outright: its watchdog deletes what it created
        deleter = [
            sys.executable,
            "-m",
            "infra.kubernetes",
            "delete-on-death",
            str(os.getpid()),
            name,
            self.options.model_dump_json(),
        ]
        with watchdog(deleter):
            try:
                self._created.append(("service", name))
                core.create_namespaced_service(self.namespace, service)
                self._created.append(("job", name))
                batch.create_namespaced_job(self.namespace, k8s_job)
                while (outcome := self.job_outcome(name)) == "running":
                    if job.cancel.is_set():
                        outcome = "cancelled"
                        break
                    if deadline is not None and time.monotonic() > deadline:
                        outcome = "timeout"
                        break
                    time.sleep(self.poll_s)
                self.collect_logs(name, job, echo)
            finally:
                self.delete(name)
        rc = {"succeeded": 0, "failed": 1, "timeout": 124, "cancelled": 1}[outcome]
        text = job.log_path.read_text(errors="replace") if job.log_path.exists() else ""
        return JobResult(
            rc, time.monotonic() - start, job.log_path, failed_ranks_from_log(text) if rc else [], outcome == "timeout",
            cancelled=outcome == "cancelled",
        )

    def job_outcome(self, name: str) -> str:
        """running, succeeded, failed or timeout, from the Job's status and conditions."""
        status = self._client()[1].read_namespaced_job_status(name, self.namespace).status
        conditions = {c.type: c for c in (status.conditions or []) if c.status == "True"}
        if "Complete" in conditions or (status.succeeded or 0) >= self.nodes:
            return "succeeded"
        if "Failed" in conditions:
            # activeDeadlineSeconds (the job's timeout) passed
            return "timeout" if conditions["Failed"].reason == "DeadlineExceeded" else "failed"
        return "failed" if (status.failed or 0) > 0 else "running"

    def collect_logs(self, name: str, job: Job, echo: bool) -> None:
        """Every pod's log, in node order, into the job's log file."""
        from kubernetes.client.exceptions import ApiException

        core = self._client()[0]
        pods = core.list_namespaced_pod(self.namespace, label_selector=f"{JOB_LABEL}={name}").items

        def index(pod: Any) -> int:
            annotations = pod.metadata.annotations or {}
            return int(annotations.get("batch.kubernetes.io/job-completion-index", 0))

        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(job.log_path, "w") as log:
            for pod in sorted(pods, key=index):
                try:
                    text = core.read_namespaced_pod_log(pod.metadata.name, self.namespace)
                except ApiException as err:  # a pod that never started has no log
                    text = f"(no log: {err.reason})\n"
                block = f"==> node {index(pod)} ({pod.metadata.name}) <==\n{text}"
                log.write(block if block.endswith("\n") else block + "\n")
                if echo:
                    print(block)

    def delete(self, name: str) -> None:
        """Delete the Job (its pods with it) and the Service; a missing object is fine."""
        from kubernetes.client.exceptions import ApiException

        core, batch, _ = self._client()
        for kind, obj in [k for k in self._created if k[1] == name]:
            try:
                if kind == "job":
                    batch.delete_namespaced_job(obj, self.namespace, propagation_policy="Background")
                else:
                    core.delete_namespaced_service(obj, self.namespace)
            except ApiException as err:
                if err.status != 404:
                    raise ProviderError(f"kubernetes: deleting {kind} {obj}: {err}") from None
            self._created.remove((kind, obj))

    def delete_orphans(self) -> list[str]:
        """Delete the Jobs (and Services) in the namespace whose launcher ran on this host and is
        gone; their names. Jobs of other hosts' launchers, and of live ones, are left alone."""
        here = Launcher.this()
        selector = f"{LAUNCHER_HOST_LABEL}={_label_value(here.host)}"
        orphans = []
        for k8s_job in self._client()[1].list_namespaced_job(self.namespace, label_selector=selector).items:
            tag = (k8s_job.metadata.annotations or {}).get(LAUNCHER_ANNOTATION, "")
            launcher = Launcher.parse(tag)
            if launcher is not None and launcher.here() and not launcher.alive():
                orphans.append(k8s_job.metadata.name)
        for name in orphans:
            self._created += [("job", name), ("service", name)]
            self.delete(name)
        return orphans

    def teardown(self) -> None:
        for name in {obj for _, obj in self._created}:
            self.delete(name)
        if self.run_label:  # the run's: every Job (and its Service) still labelled with it
            selector = f"{RUN_LABEL}={self.run_label}"
            for k8s_job in self._client()[1].list_namespaced_job(self.namespace, label_selector=selector).items:
                name = k8s_job.metadata.name
                self._created += [("job", name), ("service", name)]
                self.delete(name)


def main() -> None:
    """`python -m infra.kubernetes delete-on-death PID NAME OPTIONS_JSON`: a launcher's watchdog.
    Ready to talk to the API server first (the client's imports take seconds), it deletes the
    run's Job and Service once the launcher PID has died."""
    if len(sys.argv) != 5 or sys.argv[1] != "delete-on-death" or not sys.argv[2].isdigit():
        print("usage: python -m infra.kubernetes delete-on-death PID NAME OPTIONS_JSON", file=sys.stderr)
        sys.exit(2)
    name = sys.argv[3]
    provider = KubernetesProvider(**json.loads(sys.argv[4]))
    provider._client()
    from kubernetes.client.exceptions import ApiException  # noqa: F401 - imported before it is needed

    wait_for_exit(int(sys.argv[2]))
    provider._created = [("job", name), ("service", name)]
    provider.delete(name)


if __name__ == "__main__":
    main()
