"""The `kubernetes` provider without a cluster.

The generated objects are checked against the client library's API models, and the
submit / watch / logs / delete logic runs through the real Kubernetes client against a small
HTTP server started here (127.0.0.1 only) that speaks the few API calls the provider uses,
in the shapes the API documents. It validates what it receives as a real API server would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import psutil
import pytest
import yaml
from kubernetes import client

from infra import Job, ProviderError, get_provider
from infra.base import base_env
from infra.kubernetes import JOB_LABEL, LAUNCHER_ANNOTATION, LAUNCHER_PID_LABEL, KubernetesProvider
from tests.conftest import free_port

REPO = Path(__file__).resolve().parent.parent
DEPLOY = Path(__file__).resolve().parent.parent / "infra" / "deploy" / "kubernetes"
ROOT_CAUSE = """[rank1]: RuntimeError: boom
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_00:00:00
  host      : {pod}
  rank      : 1 (local_rank: 0)
  exitcode  : 1 (pid: 42)
"""


def validated(model: type, body: dict) -> object:
    """The body as a client model; unknown or misspelled fields fail (from_dict drops them)."""
    obj = model.from_dict(body)
    assert client.ApiClient().sanitize_for_serialization(obj) == body
    return obj


class FakeApiServer(ThreadingHTTPServer):
    """Jobs, services, pods and logs in memory; `outcome` decides how each job ends."""

    def __init__(self, outcome: str, nodes: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.outcome, self.nodes = outcome, nodes
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.polls: dict[str, int] = {}
        self.requests: list[tuple[str, str]] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def job_status(self, name: str) -> dict:
        self.polls[name] = self.polls.get(name, 0) + 1
        if self.polls[name] < 2 or self.outcome == "hang":
            return {"active": self.nodes, "startTime": "2026-01-01T00:00:00Z"}
        if self.outcome == "succeed":
            return {
                "succeeded": self.nodes,
                "completedIndexes": f"0-{self.nodes - 1}",
                "conditions": [{"type": "Complete", "status": "True"}],
            }
        reason = "DeadlineExceeded" if self.outcome == "deadline" else "BackoffLimitExceeded"
        return {"failed": 1, "active": 0, "conditions": [{"type": "Failed", "status": "True", "reason": reason}]}

    def pods(self, namespace: str, job: str) -> list[dict]:
        if ("jobs", namespace, job) not in self.objects:
            return []
        return [
            {
                "metadata": {
                    "name": f"{job}-{i}-x{i}",
                    "namespace": namespace,
                    "labels": {JOB_LABEL: job},
                    "annotations": {"batch.kubernetes.io/job-completion-index": str(i)},
                }
            }
            for i in reversed(range(self.nodes))
        ]

    def log(self, pod: str) -> str:
        index = int(pod.split("-")[-2])
        if self.outcome == "fail" and index == 1:
            return ROOT_CAUSE.format(pod=pod)
        return f"node {index} trained\n"


class _Handler(BaseHTTPRequestHandler):
    server: FakeApiServer

    def log_message(self, *args: object) -> None:
        pass

    def reply(self, code: int, body: dict | str) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def status(self, code: int, reason: str, message: str) -> None:
        self.reply(
            code,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": code,
                "reason": reason,
                "message": message,
            },
        )

    def route(self) -> tuple[str, str, str | None, str | None]:
        url = urlparse(self.path)
        self.server.requests.append((self.command, url.path))
        m = re.fullmatch(
            r"/apis?/(?:batch/)?v1/namespaces/([^/]+)/(jobs|services|pods)"
            r"(?:/([^/]+))?(?:/(status|log))?",
            url.path,
        )
        if not m:
            return url.path, "", None, None
        ns, kind, name, sub = m.groups()
        return kind, ns, name, sub

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/version":
            return self.reply(
                200,
                {
                    "major": "1",
                    "minor": "30",
                    "gitVersion": "v1.30.0",
                    "gitCommit": "0" * 40,
                    "gitTreeState": "clean",
                    "buildDate": "2026-01-01T00:00:00Z",
                    "goVersion": "go1.22",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
        kind, ns, name, sub = self.route()
        if kind == "jobs" and sub == "status" and ("jobs", ns, name) in self.server.objects:
            body = dict(self.server.objects[("jobs", ns, name)])
            return self.reply(200, body | {"status": self.server.job_status(name)})
        if kind == "pods" and name is None:
            selector = parse_qs(urlparse(self.path).query).get("labelSelector", [""])[0]
            job = selector.removeprefix(f"{JOB_LABEL}=")
            return self.reply(
                200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": self.server.pods(ns, job)}
            )
        if kind == "jobs" and name is None:
            key, _, value = parse_qs(urlparse(self.path).query).get("labelSelector", [""])[0].partition("=")
            items = [
                body
                for (k, n, _), body in self.server.objects.items()
                if k == "jobs" and n == ns and body["metadata"]["labels"].get(key) == value
            ]
            return self.reply(200, {"kind": "JobList", "apiVersion": "batch/v1", "metadata": {}, "items": items})
        if kind == "pods" and sub == "log":
            return self.reply(200, self.server.log(name))
        self.status(404, "NotFound", f"{self.path} not found")

    def do_POST(self) -> None:
        kind, ns, name, _ = self.route()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model = {"jobs": client.V1Job, "services": client.V1Service}.get(kind)
        if model is None or name is not None:
            return self.status(404, "NotFound", f"{self.path} not found")
        try:
            validated(model, body)
        except Exception as err:  # the API server answers 422 Invalid to a malformed object
            return self.status(422, "Invalid", str(err))
        key = (kind, ns, body["metadata"]["name"])
        if key in self.server.objects:
            return self.status(409, "AlreadyExists", f"{key} exists")
        self.server.objects[key] = body
        self.reply(201, body)

    def do_DELETE(self) -> None:
        kind, ns, name, _ = self.route()
        body = self.server.objects.pop((kind, ns, name), None)
        if body is None:
            return self.status(404, "NotFound", f"{kind} {name} not found")
        # as documented: a deleted Service comes back as itself, a deleted Job as a Status
        if kind == "services":
            return self.reply(200, body)
        self.reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


@pytest.fixture
def api_server(request):
    outcome, nodes = request.param
    server = FakeApiServer(outcome, nodes)
    yield server
    server.shutdown()
    server.server_close()


def provider_options(**extra) -> dict:
    return {
        "nodes": 2,
        "image": "registry.example/ddlbench:1.0",
        "namespace": "bench",
        "gpus_per_node": 4,
        "node_selector": {"nvidia.com/gpu.product": "H100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "cpu": "8",
        "memory": "32Gi",
        "volume_claim": "ddlbench-runs",
        "mount_path": "/runs",
    } | extra


def test_objects_validate_against_the_api_models(tmp_path):
    provider = KubernetesProvider(**provider_options())
    job = Job(
        module="training.run",
        args=["/runs/lenet5 a"],
        world_size=8,
        log_path=tmp_path / "launcher.log",
        env={"NCCL_DEBUG": "WARN"},
        timeout_s=600,
    )
    service, k8s_job = provider.objects(job, "ddlbench-abc")
    svc = validated(client.V1Service, service)
    kj = validated(client.V1Job, k8s_job)
    assert svc.spec.cluster_ip == "None" and svc.spec.selector == {JOB_LABEL: "ddlbench-abc"}
    assert kj.spec.completion_mode == "Indexed" and kj.spec.completions == kj.spec.parallelism == 2
    assert kj.spec.backoff_limit == 0 and kj.spec.active_deadline_seconds == 600
    pod = kj.spec.template.spec
    assert kj.spec.template.metadata.labels[JOB_LABEL] == "ddlbench-abc"
    assert pod.subdomain == "ddlbench-abc" and pod.restart_policy == "Never"
    assert pod.node_selector == {"nvidia.com/gpu.product": "H100"}
    assert pod.tolerations[0].key == "nvidia.com/gpu" and pod.tolerations[0].effect == "NoSchedule"
    assert pod.volumes[0].persistent_volume_claim.claim_name == "ddlbench-runs"
    (container,) = pod.containers
    assert container.image == "registry.example/ddlbench:1.0"
    assert container.resources.limits == {"nvidia.com/gpu": "4"}
    assert container.resources.requests == {"cpu": "8", "memory": "32Gi"}
    assert container.volume_mounts[0].mount_path == "/runs"
    assert {e.name: e.value for e in container.env}["NCCL_DEBUG"] == "WARN"
    command = container.command[2]
    for word in (
        "-m infra.zygote --nprocs=4,4",
        '--agent="$JOB_COMPLETION_INDEX"',
        "--master-addr=ddlbench-abc-0.ddlbench-abc",
        "--master-port=29500",
        "-m training.run '/runs/lenet5 a'",
    ):
        assert word in command


def test_option_errors(tmp_path):
    with pytest.raises(ProviderError, match=r"provider.options.tolerations\[0\]"):
        KubernetesProvider(tolerations=[{"kee": "x"}])
    with pytest.raises(ProviderError, match="provider.options.node_selector"):
        KubernetesProvider(node_selector={"gpu": 1})
    with pytest.raises(ProviderError, match="provider.options.mount_path"):
        KubernetesProvider(volume_claim="runs")
    with pytest.raises(ProviderError, match="provider.options.name_prefix"):
        KubernetesProvider(name_prefix="DDL_bench")
    with pytest.raises(ProviderError, match="provider.options: .*unexpected keyword argument 'gpu'"):
        get_provider("kubernetes", gpu=1)
    with pytest.raises(ProviderError, match="provider.options.server_nodes: dedicated shards need 1 to 1"):
        KubernetesProvider(nodes=2, placement="dedicated", server_nodes=2).objects(
            Job("training.run", [], 3, tmp_path / "log", servers=1), "x")


@pytest.mark.parametrize("agents, code", [
    (["exit 0", "exit 0"], 0),  # both ended before the pod asks: each is still waited for
    (["exit 3", "sleep 30"], 3),  # the first to fail ends the other at once
    (["sleep 0.3; exit 0", "exit 4"], 4),
    (["sleep 0.1; exit 5", "sleep 0.1; exit 0"], 5),
])
def test_a_pod_with_several_agents_exits_with_the_first_failure(agents: list[str], code: int) -> None:
    """Pod 0's command with its two agents replaced by shell stand-ins, 4 pods at once
    (the pods mostly sleep: together they take the time of one)."""
    provider = KubernetesProvider(nodes=2, gpus_per_node=1, python=sys.executable, master_port=29500)
    job = Job("tests.rank_probe", ["out"], world_size=3, servers=1, log_path=Path("log"))
    command = provider.objects(job, "probe")[1]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    runs = iter(agents * 4)
    agent = r"\S+ -m infra\.zygote .*? -m tests\.rank_probe out"
    command = re.sub(agent, lambda _: f"({next(runs)})", command)
    started = time.monotonic()
    pods = [subprocess.Popen(["bash", "-c", command], env={"JOB_COMPLETION_INDEX": "0", "PATH": os.environ["PATH"]})
            for _ in range(4)]
    codes = [pod.wait(timeout=20) for pod in pods]
    assert codes == [code] * 4 and time.monotonic() - started < 5


@pytest.mark.slow  # the agents, run here for real
def test_a_placement_with_different_ranks_per_pod_runs_its_agents_with_the_roles_kept(tmp_path):
    """2 workers + 1 colocated shard on 2 pods: pod 0 runs worker 0 and the shard (two
    agents), pod 1 worker 1. Each pod's command runs here for real (over loopback)."""
    provider = KubernetesProvider(nodes=2, gpus_per_node=1, python=sys.executable,
                                  master_port=free_port())
    job = Job("tests.rank_probe", [str(tmp_path)], world_size=3, servers=1, log_path=tmp_path / "log")
    _, k8s_job = provider.objects(job, "probe")
    pod = k8s_job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert k8s_job["spec"]["completions"] == 2
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}  # one worker per device
    command = container["command"][2]
    assert 'case "$JOB_COMPLETION_INDEX" in' in command
    pod0 = next(line for line in command.splitlines() if line.startswith("  0)"))
    assert pod0.count("infra.zygote") == 2 and "--agent=0" in pod0 and "--agent=2" in pod0
    command = command.replace("probe-0.probe", "127.0.0.1")  # the headless Service's name, here
    env = base_env() | {"PYTHONPATH": str(REPO)}
    pods = [subprocess.Popen(["bash", "-c", command],
                             env=env | {"JOB_COMPLETION_INDEX": str(i), "DDLBENCH_POD": str(i)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            for i in range(2)]
    try:
        assert [p.wait(120) for p in pods] == [0, 0]
    finally:
        for p in pods:
            p.kill()
    ranks = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)}
    assert {r: v["DDLBENCH_POD"] for r, v in ranks.items()} == {0: "0", 1: "1", 2: "0"}
    assert all(v["WORLD_SIZE"] == "3" and v["LOCAL_RANK"] == "0" for v in ranks.values())


def test_an_unreachable_api_server_is_a_clear_error():
    provider = KubernetesProvider(api_server="http://127.0.0.1:9")
    with pytest.raises(ProviderError, match="kubernetes: the API server does not answer"):
        provider.provision()


def run_through(server: FakeApiServer, tmp_path: Path, timeout_s: float | None = 60):
    provider = get_provider("kubernetes", **provider_options(api_server=server.url, poll_s=0.05))
    job = Job(
        module="training.run",
        args=[str(tmp_path)],
        world_size=8,  # 2 nodes x gpus_per_node 4: one worker per device
        log_path=tmp_path / "launcher.log",
        timeout_s=timeout_s,
    )
    with provider:
        result = provider.run(job, echo=False)
    return provider, result


@pytest.mark.parametrize("api_server", [("succeed", 2)], indirect=True)
def test_submit_watch_collect_delete(api_server, tmp_path):
    provider, result = run_through(api_server, tmp_path)
    name = provider.last_job_name
    assert result.ok and result.returncode == 0
    assert result.log_path.read_text() == (
        f"==> node 0 ({name}-0-x0) <==\nnode 0 trained\n==> node 1 ({name}-1-x1) <==\nnode 1 trained\n"
    )
    assert api_server.objects == {}
    calls = [(m, p) for m, p in api_server.requests]
    assert [c for c in calls if c[0] == "POST"] == [
        ("POST", "/api/v1/namespaces/bench/services"),
        ("POST", "/apis/batch/v1/namespaces/bench/jobs"),
    ]
    assert ("DELETE", f"/apis/batch/v1/namespaces/bench/jobs/{name}") in calls
    assert ("DELETE", f"/api/v1/namespaces/bench/services/{name}") in calls
    assert api_server.polls[name] == 2


@pytest.mark.parametrize("api_server", [("fail", 2)], indirect=True)
def test_a_failed_pod_fails_the_job_and_names_its_rank(api_server, tmp_path):
    _, result = run_through(api_server, tmp_path)
    assert not result.ok and not result.timed_out
    assert result.failed_ranks == [{"rank": 1, "exitcode": 1}]
    assert api_server.objects == {}


@pytest.mark.parametrize("api_server", [("hang", 2)], indirect=True)
def test_a_job_past_its_timeout_is_deleted(api_server, tmp_path):
    _, result = run_through(api_server, tmp_path, timeout_s=0.5)
    assert result.timed_out and result.returncode == 124
    assert 0.5 <= result.duration_s < 5
    assert api_server.objects == {}


@pytest.mark.parametrize("api_server", [("hang", 2)], indirect=True)
def test_a_cancelled_job_is_deleted(api_server, tmp_path):
    """The launcher's cancel (it saw a rank stop beating) ends the job as its timeout does."""
    provider = get_provider("kubernetes", **provider_options(api_server=api_server.url, poll_s=0.05))
    job = Job(module="training.run", args=[str(tmp_path)], world_size=8, log_path=tmp_path / "launcher.log",
              timeout_s=60)
    with provider:
        threading.Timer(0.5, job.cancel.set).start()
        result = provider.run(job, echo=False)
    assert result.cancelled and result.returncode == 1 and not result.timed_out
    assert 0.5 <= result.duration_s < 5
    assert api_server.objects == {}


@pytest.mark.parametrize("api_server", [("deadline", 2)], indirect=True)
def test_the_active_deadline_counts_as_a_timeout(api_server, tmp_path):
    _, result = run_through(api_server, tmp_path)
    assert result.timed_out and not result.ok
    assert api_server.objects == {}


@pytest.mark.parametrize("api_server", [("succeed", 2)], indirect=True)
def test_one_run_label_for_a_pipeline_runs_jobs_and_its_teardown_deletes_what_carries_it(api_server, tmp_path):
    """One cluster per pipeline run: `provision` names the run, a task in another process adopts
    its handle, its Job and Service carry the run's label, and the run's teardown deletes every
    Job and Service still labelled with it (left by a task killed with its watchdog), only those."""
    from infra.kubernetes import RUN_LABEL

    options = provider_options(api_server=api_server.url, poll_s=0.05)
    provisioner = KubernetesProvider(**options)
    provisioner.provision_shared()
    handle = provisioner.handle()
    assert handle == {"run": provisioner.run_label, "namespace": "bench"} and json.loads(json.dumps(handle)) == handle
    with pytest.raises(ProviderError, match="provider.options.namespace: the run's jobs are in 'bench'"):
        KubernetesProvider(**options | {"namespace": "other"}).adopt(handle)

    task = KubernetesProvider(**options)
    task.adopt(handle)
    job = Job(module="training.run", args=[str(tmp_path)], world_size=8, log_path=tmp_path / "launcher.log")
    for obj in task.objects(job, "ddlbench-left"):
        assert obj["metadata"]["labels"][RUN_LABEL] == handle["run"]
    assert task.objects(job, "x")[1]["spec"]["template"]["metadata"]["labels"][RUN_LABEL] == handle["run"]
    assert task.run(job, echo=False).ok
    assert api_server.objects == {}  # the job's own objects went with it

    api = client.ApiClient(client.Configuration(host=api_server.url))
    left_service, left_job = task.objects(job, "ddlbench-left")
    client.CoreV1Api(api).create_namespaced_service("bench", left_service)
    client.BatchV1Api(api).create_namespaced_job("bench", left_job)
    _, others = KubernetesProvider(**options).objects(job, "ddlbench-other")  # no run label: not this run's
    client.BatchV1Api(api).create_namespaced_job("bench", others)

    released = KubernetesProvider(**options)
    released.adopt(handle)
    released.teardown()
    released.teardown()  # again: nothing left, no error
    assert set(api_server.objects) == {("jobs", "bench", "ddlbench-other")}


def test_the_rbac_role_allows_every_call_the_provider_makes():
    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "Role")
    allowed = {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}
    needed = {
        ("jobs", "create"),
        ("jobs", "list"),
        ("jobs", "delete"),
        ("jobs/status", "get"),
        ("services", "create"),
        ("services", "delete"),
        ("pods", "list"),
        ("pods/log", "get"),
    }
    assert needed <= allowed
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Role", "RoleBinding"}


@pytest.mark.parametrize("api_server", [("succeed", 2)], indirect=True)
def test_the_job_names_its_launcher(api_server, tmp_path):
    from infra.lifeline import Launcher

    provider = KubernetesProvider(**provider_options())
    job = Job(module="training.run", args=[str(tmp_path)], world_size=8, log_path=tmp_path / "launcher.log")
    for obj in provider.objects(job, "ddlbench-abc"):
        meta = obj["metadata"]
        assert meta["labels"][LAUNCHER_PID_LABEL] == str(os.getpid())
        assert Launcher.parse(meta["annotations"][LAUNCHER_ANNOTATION]) == Launcher.this()


def _launcher(server: FakeApiServer, tmp_path: Path) -> subprocess.Popen:
    """A process running a job that never ends through `server`, once its Job exists."""
    code = (
        "import sys; from pathlib import Path; from infra import Job; from infra.kubernetes import KubernetesProvider\n"
        "job = Job(module='training.run', args=['x'], world_size=2, log_path=Path(sys.argv[2]))\n"
        "with KubernetesProvider(nodes=2, namespace='bench', api_server=sys.argv[1], poll_s=0.05) as provider:\n"
        "    provider.run(job, echo=False)\n"
    )
    before = set(server.objects)
    launcher = subprocess.Popen([sys.executable, "-c", code, server.url, str(tmp_path / "launcher.log")], cwd=REPO)
    deadline = time.monotonic() + 60
    while not any(kind == "jobs" for kind, _, _ in set(server.objects) - before):
        assert launcher.poll() is None and time.monotonic() < deadline, "the launcher never created its Job"
        time.sleep(0.05)
    return launcher


def _holds_a_pidfd(pid: int) -> bool:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if "pidfd" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                return True
        except FileNotFoundError:  # closed meanwhile
            continue
    return False


def _watchdog(launcher: subprocess.Popen) -> psutil.Process:
    """The launcher's watchdog once it waits on the launcher's pidfd (its client imported: a job
    runs far longer than that)."""
    (watchdog,) = [p for p in psutil.Process(launcher.pid).children() if "delete-on-death" in p.cmdline()]
    deadline = time.monotonic() + 60
    while not _holds_a_pidfd(watchdog.pid):
        assert time.monotonic() < deadline, "the watchdog never got ready"
        time.sleep(0.05)
    return watchdog


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.parametrize("api_server", [("hang", 2)], indirect=True)
def test_sigkill_of_the_launcher_deletes_its_job_and_service_within_10_s(api_server, tmp_path):
    launcher = _launcher(api_server, tmp_path)
    _watchdog(launcher)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while api_server.objects and time.monotonic() < deadline:
        time.sleep(0.1)
    assert api_server.objects == {}
    print(f"Job and Service deleted {time.monotonic() - deadline + 10:.1f} s after the launcher's SIGKILL")


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.parametrize("api_server", [("hang", 2)], indirect=True)
def test_cleanup_deletes_jobs_of_dead_launchers_only(api_server, tmp_path):
    """The launcher's watchdog died with it: `ddlbench cleanup --kubernetes` deletes its Job and
    Service; a live launcher's Job (this process's) stays."""
    provider = KubernetesProvider(nodes=2, namespace="bench", api_server=api_server.url)
    live = Job(module="training.run", args=["y"], world_size=2, log_path=tmp_path / "live.log")
    core, batch, _ = provider._client()
    service, k8s_job = provider.objects(live, "ddlbench-live")
    core.create_namespaced_service("bench", service)
    batch.create_namespaced_job("bench", k8s_job)
    launcher = _launcher(api_server, tmp_path)
    watchdog = _watchdog(launcher)
    watchdog.kill()
    while watchdog.is_running() and watchdog.status() != psutil.STATUS_ZOMBIE:  # dead, unreaped
        time.sleep(0.05)
    launcher.kill()
    launcher.wait()
    (orphan,) = {n for _, _, n in api_server.objects} - {"ddlbench-live"}
    options = json.dumps({"namespace": "bench", "api_server": api_server.url})
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ddlbench")), "cleanup", "--kubernetes", options],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"removed kubernetes job bench/{orphan}" in done.stdout
    assert set(api_server.objects) == {("services", "bench", "ddlbench-live"), ("jobs", "bench", "ddlbench-live")}
