"""The `netns` provider: an emulated cluster on one Linux host (DESIGN §5).

Each node is a network namespace with one veth link into a bridge that lives in
the host namespace. The bridge carries no address, so the cluster's subnet
exists only inside the namespaces and no traffic leaves them. Every link is
shaped with `tc tbf` in both directions (the namespace end shapes what the
node sends, the bridge end what it receives), like a full-duplex NIC.

torchrun runs once per node under `ip netns exec`, with static rendezvous on
node 0's address and gloo bound to the node's interface. Names carry their
owner's pid and a random tag, so parallel providers never collide, and a
provider that finds namespaces of a dead owner (a SIGKILLed run) removes them.

The owner is the provisioning process, or, for a cluster that the tasks of one
pipeline run share (`provision_shared`; Airflow tasks are short processes of their
own), a keeper: `python -m infra.netns keep`, in a session of its own, which lives
until teardown stops it. If the provisioning process dies before the cluster is
built, past its lease (`lease_s`), or once the process it is told to watch has died
(the one `ddlbench run` process), the keeper removes the cluster itself; a keeper
killed outright leaves a dead owner's cluster, which the next
provision or `ddlbench cleanup` removes. Other processes use the cluster through its
`handle()` (tag, keeper, nodes) and `adopt()`.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import time
from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator

from infra import bounds
from infra.base import (
    Job,
    JobResult,
    Node,
    Provider,
    ProviderError,
    base_env,
    launch_argv,
    run_processes,
)
from infra.lifeline import Launcher, importable_env
from infra.node_usage import NodeUsage, link_bytes, namespace_pids, processes
from infra.options import PlacementOptions, integer_at_least
from infra.units import parse_rate  # bytes per second

_PREFIX = "ddlb"
_NS_RE = re.compile(rf"^{_PREFIX}-(\d+)-([0-9a-f]{{6}})-(\d+)$")
# tc's decimal bit units only: tc reads a bare number as bits and "mbps" as megabytes per second.
_TC_RATE_RE = re.compile(r"\s*[0-9]*\.?[0-9]+\s*[kmgt]?bit\s*", re.IGNORECASE)
_PRIVATE_NETS = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("192.168.0.0/16"))


def _tc_bits_per_s(rate: Any) -> int:
    """'100mbit' -> 100_000_000; ValueError for anything tc would read otherwise."""
    problem = f"expected a positive rate such as 100mbit, 1gbit or 10gbit, got {rate!r}"
    if not _TC_RATE_RE.fullmatch(str(rate)):
        raise ValueError(problem)
    try:
        bytes_per_s = parse_rate(str(rate))
    except ValueError:
        raise ValueError(problem) from None
    return int(round(bytes_per_s * 8, 6))  # rounded first: /8 then *8 must give the bits written


def parse_bandwidth(rate: str) -> int:
    """'100mbit' -> 100_000_000 bits/s (tc's decimal units: bit, kbit, mbit, gbit, tbit)."""
    try:
        return _tc_bits_per_s(rate)
    except ValueError as err:
        raise ProviderError(f"provider.options.bandwidth: {err}") from None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ProviderError(f"netns: `ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def _tc(*args: str) -> None:
    proc = subprocess.run(["tc", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ProviderError(f"netns: `tc {' '.join(args)}` failed: {proc.stderr.strip()}")


def _pid_alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its parent to reap it does not)."""
    return Launcher.of(pid).start != 0


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILL what still runs in a namespace (live processes keep it alive past `ip netns del`)."""
    for _ in range(20):
        out = _ip("netns", "pids", ns, check=False).stdout.split()
        if not out:
            return
        for pid in out:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        time.sleep(0.05)


def _remove_cluster(tag: str, namespaces: list[str]) -> None:
    """Processes, veth pairs, namespaces, then the bridge.

    The veths are deleted explicitly: a deleted namespace releases its devices asynchronously,
    so the host ends would linger for a moment after `ip netns del` returns.
    """
    for ns in namespaces:
        _kill_namespace_processes(ns)
    for line in _ip("-o", "link", "show", "type", "veth", check=False).stdout.splitlines():
        dev = line.split(":")[1].strip().split("@")[0]
        if dev.startswith(f"dh{tag}"):
            _ip("link", "del", dev, check=False)
    for ns in namespaces:
        _ip("netns", "del", ns, check=False)
    _ip("link", "del", f"db{tag}", check=False)


def cleanup_stale() -> list[str]:
    """Remove namespaces and bridges of providers whose process is gone; return the namespaces."""
    clusters: dict[str, list[str]] = {}
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = _NS_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            clusters.setdefault(m.group(2), []).append(name)
    for tag, namespaces in clusters.items():
        _remove_cluster(tag, namespaces)
    return [ns for names in clusters.values() for ns in names]


class NetnsOptions(PlacementOptions):
    nodes: Annotated[int, integer_at_least(1, "a positive integer", most=bounds.NETNS_NODES)] = Field(
        2, description="Nodes: one network namespace each."
    )
    bandwidth: str | None = Field(
        "1gbit", description="Each link's rate in tc's bit units (100mbit, 1gbit); None leaves links unshaped."
    )
    subnet: str = Field("10.213.0.0/24", description="The cluster's private subnet (10.0.0.0/8 or 192.168.0.0/16).")
    master_port: int = Field(29500, ge=1, le=65535, description="torchrun's static rendezvous port on node 0.")
    lease_s: float = Field(
        86400.0,
        gt=0,
        le=bounds.LEASE_S.limit,
        description="Seconds a cluster shared by a pipeline run's tasks stays up at most when no teardown "
        "comes (an abandoned run): its keeper then removes it.",
    )

    @field_validator("bandwidth", mode="before")
    @classmethod
    def _rate(cls, v: Any) -> Any:
        if v is not None:
            _tc_bits_per_s(v)
        return v

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, v: str, info: ValidationInfo) -> str:
        net = ipaddress.ip_network(v, strict=True)  # its ValueError names what is wrong
        if not any(net.version == p.version and net.subnet_of(p) for p in _PRIVATE_NETS):
            raise ValueError(
                f"{v} is outside 10.0.0.0/8 and 192.168.0.0/16; the emulated cluster only uses private addresses"
            )
        nodes = info.data.get("nodes")
        if nodes is not None and net.num_addresses - 2 < nodes:
            raise ValueError(f"{v} has room for {net.num_addresses - 2} nodes, {nodes} requested")
        return v


class NetnsProvider(Provider):
    """K nodes as network namespaces on a bridge, each link shaped to `bandwidth`."""

    name = "netns"
    one_host = True
    measures_host_load = True
    forks_warm = True
    options_model = NetnsOptions

    def __init__(self, **options: Any) -> None:
        self.options = opts = NetnsOptions.parse(options)
        self.nodes = opts.nodes
        self.bandwidth = opts.bandwidth
        self.rate_bps = _tc_bits_per_s(opts.bandwidth) if opts.bandwidth is not None else None
        self.subnet = ipaddress.ip_network(opts.subnet)
        self.master_port = opts.master_port
        self.threads = opts.threads_per_process
        self.tag = secrets.token_hex(3)
        # the owner's pid in every namespace name lets a later provider spot a dead owner's leftovers
        self.owner_pid = os.getpid()
        self._nodes: list[Node] = []
        self._keeper: Launcher | None = None  # the owner of a shared cluster
        self._keeper_proc: subprocess.Popen | None = None
        self._adopted: list[Node] | None = None  # the nodes of a cluster another process provisioned

    def ns_name(self, i: int) -> str:
        return f"{_PREFIX}-{self.owner_pid}-{self.tag}-{i}"

    def ifname(self, i: int) -> str:
        """The node's interface inside its namespace (what gloo binds to); 15 characters at most."""
        return f"dn{self.tag}{i}"

    def _host_ifname(self, i: int) -> str:
        return f"dh{self.tag}{i}"

    @property
    def provisioned(self) -> bool:
        return bool(self._nodes)

    def provision(self) -> list[Node]:
        if os.geteuid() != 0:
            raise ProviderError("netns: network namespaces need root (run as root, or use the local provider)")
        if self._nodes:
            return self._nodes
        if self._adopted is not None:
            self._check_adopted()
            self._nodes = self._adopted
            return self._nodes
        cleanup_stale()
        try:
            self._nodes = self._build()
        except BaseException:
            # a half-built cluster must not outlive a failed provision
            self.teardown()
            raise
        return self._nodes

    def provision_shared(self, owner: int | None = None) -> list[Node]:
        """The cluster owned by a keeper that outlives this process (see the module's docstring)."""
        if os.geteuid() != 0:
            raise ProviderError("netns: network namespaces need root (run as root, or use the local provider)")
        if self._nodes or self._adopted is not None:
            return self.provision()
        argv = [sys.executable, "-m", "infra.netns", "keep", self.tag, str(self.nodes),
                str(self.options.lease_s), str(owner or 0)]
        # its stdin stays ours until the cluster is built: should we die before, the keeper removes it
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, env=importable_env())
        self._keeper_proc = proc
        self._keeper = Launcher.of(proc.pid)
        self.owner_pid = proc.pid
        nodes = self.provision()
        assert proc.stdin is not None
        proc.stdin.write(b"d")  # handed over: from now on teardown, the lease or `owner` ends it
        proc.stdin.close()
        return nodes

    def handle(self) -> dict[str, Any]:
        """{tag, keeper (host.pid.start), nodes [{name, address}], bandwidth}; {} for a cluster that
        only this process owns (it ends with it)."""
        if self._keeper is None or not self._nodes:
            return {}
        return {
            "tag": self.tag,
            "keeper": self._keeper.tag(),
            "nodes": [{"name": n.name, "address": n.address} for n in self._nodes],
            "bandwidth": self.bandwidth,
        }

    def adopt(self, handle: dict[str, Any]) -> None:
        if not handle:
            return
        try:
            tag, keeper = str(handle["tag"]), Launcher.parse(str(handle["keeper"]))
            nodes = [Node(str(n["name"]), str(n["address"])) for n in handle["nodes"]]
        except (KeyError, TypeError) as err:
            raise ProviderError(f"netns: not a netns cluster handle (missing {err}): {handle}") from None
        if keeper is None or not re.fullmatch(r"[0-9a-f]{6}", tag):
            raise ProviderError(f"netns: not a netns cluster handle: {handle}")
        if len(nodes) != self.nodes:
            raise ProviderError(f"provider.options.nodes: the run's cluster {tag} has {len(nodes)} nodes, "
                                f"the options give {self.nodes}")
        self.tag, self.owner_pid, self._keeper = tag, keeper.pid, keeper
        self._adopted, self._nodes = nodes, []

    def _check_adopted(self) -> None:
        """An adopted cluster is still there: its keeper lives and every namespace exists."""
        assert self._keeper is not None
        missing = sorted({self.ns_name(i) for i in range(self.nodes)} - _namespaces())
        why = ("its keeper (pid " + str(self._keeper.pid) + ") is gone" if not self._keeper.alive()
               else f"namespaces {', '.join(missing)} are missing" if missing else "")
        if why:
            raise ProviderError(f"netns: the run's cluster {self.tag} is gone: {why}; it was torn down, or it "
                                "outlived its lease (provider.options.lease_s); provision it again")

    def _build(self) -> list[Node]:
        bridge = f"db{self.tag}"
        hosts = self.subnet.hosts()
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "up")
        nodes = []
        for i in range(self.nodes):
            ns, dev, peer = self.ns_name(i), self.ifname(i), self._host_ifname(i)
            addr = str(next(hosts))
            _ip("netns", "add", ns)
            _ip("link", "add", peer, "type", "veth", "peer", "name", dev, "netns", ns)
            _ip("link", "set", peer, "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/{self.subnet.prefixlen}", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if self.rate_bps is not None:
                self._shape(peer)
                self._shape(dev, ns)
            nodes.append(Node(ns, addr))
        return nodes

    def _shape(self, dev: str, ns: str | None = None) -> None:
        # The bucket must hold at least one timer tick of traffic at the rate and one
        # full-size (GSO) packet; 100 ms of queue keeps TCP at line rate without drops.
        burst = max(self.rate_bps // 8 // 250, 64 * 1024)
        args = f"qdisc replace dev {dev} root tbf rate {self.rate_bps}bit burst {burst} latency 100ms"
        _tc(*(["-n", ns] if ns else []), *args.split())

    def set_link(self, node: int, up: bool) -> None:
        """Take a node's link down or up (fault injection: the node drops off the network)."""
        _ip("-n", self.ns_name(node), "link", "set", self.ifname(node), "up" if up else "down")

    def run(self, job: Job, echo: bool = True) -> JobResult:
        placement = self.place_job(job)
        nodes = self.provision()
        argvs, envs = [], []
        # One launcher per agent ((role, node)), in rank order; agent 0 (node 0's workers) hosts the store.
        agents, nprocs = placement.agents(), placement.nprocs()
        for i, agent in enumerate(agents):
            n = agent.node
            ifname = {"GLOO_SOCKET_IFNAME": self.ifname(n), "NCCL_SOCKET_IFNAME": self.ifname(n)}
            env = base_env(self.threads) | job.env | ifname
            inside = ["ip", "netns", "exec", self.ns_name(n)]
            launcher = launch_argv(nprocs, i, nodes[0].address, self.master_port,
                                   max_restarts=job.max_restarts,
                                   warm=self.warm_socket(job, self.ns_name(n), env, inside))
            argvs.append([*inside, *launcher, "-m", job.module, *job.args])
            envs.append(env)
        return run_processes(argvs, envs, job.log_path, job.timeout_s, echo, fail_fast=job.max_restarts == 0,
                             cancel=job.cancel)

    def node_usage(self) -> dict[str, NodeUsage]:
        """Each node's CPU, memory and link bytes (infra/node_usage.py), by node name. The link's
        host end sees the node's traffic mirrored: what it receives, the node sent."""
        out = {}
        for i in range(self.nodes):
            cpu, rss, alive = processes(namespace_pids(self.ns_name(i)))
            received, sent = link_bytes(self._host_ifname(i))
            out[f"node-{i}"] = NodeUsage(cpu, rss, sent, received, alive)
        return out

    def teardown(self) -> None:
        _remove_cluster(self.tag, [self.ns_name(i) for i in range(self.nodes)])
        self._nodes = []
        self._stop_keeper()

    def _stop_keeper(self) -> None:
        """SIGTERM the keeper (if it is still the same process) and wait until it is gone: a zombie
        would still pass for a live owner."""
        keeper, proc = self._keeper, self._keeper_proc
        if keeper is None or not keeper.alive():
            return
        os.kill(keeper.pid, signal.SIGTERM)
        if proc is not None:
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
            return
        try:
            os.waitpid(keeper.pid, 0)  # our child: the `ddlbench run` process that provisioned
        except ChildProcessError:
            deadline = time.monotonic() + 10
            while keeper.alive() and time.monotonic() < deadline:
                time.sleep(0.05)


def _namespaces() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()}


def keep(tag: str, nodes: int, lease_s: float, owner: int) -> None:
    """A shared cluster's keeper: its pid is in the cluster's names, so the cluster is live while it
    runs. Teardown ends it (SIGTERM). It removes the cluster itself if the provisioning process dies
    before the cluster is built (its stdin closes without the byte "d" that hands the cluster over),
    `lease_s` after the hand-over, or once `owner` (when not 0) has died."""
    # Blocks until the byte comes or the provisioner's end of the pipe closes (it died): however
    # long building the cluster takes. The lease runs from the hand-over.
    handed_over = sys.stdin.buffer.read(1) == b"d"
    left = lease_s if handed_over else 0.0
    fd = None
    if owner and left:
        try:
            fd = os.pidfd_open(owner)
        except ProcessLookupError:
            left = 0.0
    if fd is not None:
        select.select([fd], [], [], left)  # readable once the owner has exited
    else:
        time.sleep(left)
    _remove_cluster(tag, [f"{_PREFIX}-{os.getpid()}-{tag}-{i}" for i in range(nodes)])


def main() -> None:
    args = sys.argv[1:]
    if len(args) != 5 or args[0] != "keep" or not args[2].isdigit() or not args[4].isdigit():
        print("usage: python -m infra.netns keep TAG NODES LEASE_S OWNER_PID", file=sys.stderr)
        sys.exit(2)
    keep(args[1], int(args[2]), float(args[3]), int(args[4]))


if __name__ == "__main__":
    main()
