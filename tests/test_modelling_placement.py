"""The model on node links: the PS fit by placement, token-bucket links, and the DAG's
schedule of colocated and dedicated shards against schedules computed by hand."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.placement import place
from modelling.measure.links import ps_link_queue
from modelling.network.costs import CommCosts
from modelling.network.fit import fit_comm
from modelling.plan import build_plan
from modelling.predict import build_costs, expected_straggle, predict
from modelling.scenario import Scenario
from modelling.trace import predicted_timeline
from tests.test_modelling_fit import SIZES, synthetic_comm
from tests.test_modelling_predict import layer_table
from training.measure.summary import shared_paces, worker_paces

REPO = Path(__file__).resolve().parent.parent

ALPHA, BETA = 50e-6, 8e-9  # a 1 Gbit/s link: 8 ns per byte
LINK = 1 / BETA


def _placed(workers: int, servers: int, nodes: int, policy: str) -> tuple[int, ...]:
    return place(workers, servers, nodes, policy).node_of_rank


def _ps_comm(node_of_rank: tuple[int, ...], workers: int = 2, servers: int = 1) -> dict:
    """A microbenchmark on node links: a round is a push and a pull whose latencies overlap
    and whose bytes queue, L transfers on the busiest link each way."""
    queue = ps_link_queue(workers, servers, node_of_rank)
    comm = synthetic_comm(ALPHA, BETA, 0.0, workers=workers, servers=servers)
    for row in comm["measurements"]:
        if row["primitive"] == "ps":
            row["median_s"] = 2 * (ALPHA + queue * row["bytes"] / servers * BETA)
            row["node_of_rank"] = list(node_of_rank)
    comm["environment"] = {"hosts": 1, "nodes": len(set(node_of_rank)), "cpu_count": 2, "world_size": 3}
    return comm


@pytest.mark.parametrize(
    ("workers", "servers", "nodes", "policy", "queue"),
    [
        (2, 1, 1, "colocated", 2),  # one host: both transfers on the shard's own link
        (2, 1, 2, "colocated", 1),  # the shard beside worker 0: only worker 1 crosses a link
        (2, 1, 3, "dedicated", 2),  # both workers into the shard node's downlink
        (2, 1, 2, "dedicated", 2),  # both workers on node 0 share its uplink
        (4, 1, 2, "colocated", 2),  # node 1's two workers share its uplink to the shard
        (4, 2, 2, "colocated", 2),  # each node's 2 workers to the other node's shard
    ],
)
def test_the_busiest_link_of_a_round_by_placement(workers, servers, nodes, policy, queue) -> None:
    assert ps_link_queue(workers, servers, _placed(workers, servers, nodes, policy)) == queue


@pytest.mark.parametrize(("nodes", "policy"), [(2, "colocated"), (3, "dedicated")])
def test_a_ps_round_on_node_links_fits_the_links_rate_and_is_used(nodes: int, policy: str) -> None:
    """The issue's flag: a colocated round measured at half the one-host formula's time is
    physics, not a fit faster than the link."""
    comm = _ps_comm(_placed(2, 1, nodes, policy))
    ps = next(f for f in fit_comm(comm, link_bytes_per_s=LINK)["fits"] if f["primitive"] == "ps")
    assert ps["usable"] and not ps["flags"]
    assert ps["beta_s_per_byte"] == pytest.approx(BETA, rel=1e-6)
    assert ps["alpha_s"] == pytest.approx(ALPHA, rel=1e-6)
    # One transfer, from the measured round: the round over its 2L transfers.
    assert CommCosts(fit_comm(comm))._nearest("ps", 2, 1)["link_queue"] == ps_link_queue(2, 1, ps["node_of_rank"])
    assert CommCosts(fit_comm(comm)).transfer(2, 1)(SIZES[-1]) == pytest.approx(ALPHA + SIZES[-1] * BETA, rel=1e-3)
    # A small transfer is mostly latency, which concurrent transfers do not queue for: the
    # round's latency is a push's and a pull's, however many transfers share the link.
    small = CommCosts(fit_comm(comm)).transfer(2, 1)(SIZES[0])
    assert small == pytest.approx(ALPHA + SIZES[0] * BETA, rel=1e-6)


def test_a_token_bucket_link_is_not_faster_than_its_rate() -> None:
    """tc tbf lets a burst through at once: small messages beat the rate, large ones pay it.
    The line over all sizes leans below the link's byte time; its sustained slope does not."""
    burst = 100_000
    comm = synthetic_comm(ALPHA, BETA, 0.0)
    for row in comm["measurements"]:
        if row["primitive"] == "p2p":
            row["median_s"] = ALPHA + max(row["bytes"] - burst, 0) * BETA * 1.04  # TCP/IP headers
    p2p = next(f for f in fit_comm(comm, link_bytes_per_s=LINK)["fits"] if f["primitive"] == "p2p")
    assert p2p["beta_s_per_byte"] < BETA  # what the old check flagged
    assert p2p["sustained_beta_s_per_byte"] == pytest.approx(1.04 * BETA, rel=1e-6)
    assert p2p["usable"]
    # Measured on a link of half that rate, it would beat physics: still flagged.
    fast = next(f for f in fit_comm(comm, link_bytes_per_s=LINK / 2)["fits"] if f["primitive"] == "p2p")
    assert not fast["usable"] and "faster than the link" in fast["flags"][-1]


# One linear layer: forward f, backward b; M bytes of parameters on one shard.
F, B, M = 4e-3, 8e-3, 4_000_000
DATA, PACK, UNPACK, UPDATE, SERVER_UPDATE, SERVER_ADD = 1e-4, 2e-4, 3e-4, 1e-3, 5e-4, 1e-4
TABLE = layer_table([F], [B], [M], data=DATA, update=UPDATE, pack=PACK, unpack=UNPACK,
                    server_update=SERVER_UPDATE, server_add=SERVER_ADD)
T = ALPHA + M * BETA  # one push or pull across a link
BYTES = M * BETA  # its bytes' part, which holds the link (its latency does not)
COMPUTE = DATA + F + B + PACK  # until the gradients are ready to push
SERVER = SERVER_UPDATE + SERVER_ADD  # the shard's update of 2 pushes
APPLY = SERVER_UPDATE  # an ASGD shard's apply of one push: an optimizer step (training/ps.py)


def _predict(algorithm: str, node_of_rank: tuple[int, ...], tcp_wmem_max: int | None = None) -> dict:
    raw = _ps_comm(node_of_rank)
    if tcp_wmem_max:
        raw["environment"]["tcp_wmem_max"] = tcp_wmem_max
    comm = fit_comm(raw, link_bytes_per_s=LINK)
    scenario = Scenario.of("t", algorithm=algorithm, comm="ps", workers=2, servers=1, node_of_rank=node_of_rank)
    [r] = predict(TABLE, comm, scenario)
    return r


def _iteration(algorithm: str, comm: dict, node_of_rank: tuple[int, ...], table: dict = TABLE) -> float:
    """The predicted iteration of 2 workers and 1 shard so placed, from a raw comm.json."""
    scenario = Scenario.of("t", algorithm=algorithm, comm="ps", workers=2, servers=1, node_of_rank=node_of_rank)
    [r] = predict(table, fit_comm(comm, link_bytes_per_s=LINK), scenario)
    return r["iter_time_s"]


def test_ssgd_ps_with_a_colocated_shard_equals_its_schedule_by_hand() -> None:
    # node 0: worker 0 and the shard; node 1: worker 1. Worker 0's push stays on node 0
    # (latency only); worker 1's crosses node 1's uplink and node 0's downlink, T. The
    # shard updates, sends both pulls; worker 1's takes T back. Both wait for that.
    r = _predict("ssgd", _placed(2, 1, 2, "colocated"))
    assert r["iter_time_s"] == pytest.approx(COMPUTE + T + SERVER + T + UNPACK, rel=1e-9)
    assert r["comm_s"] == pytest.approx(2 * T + SERVER, rel=1e-9)
    assert r["utilisation"]["node.up"] == pytest.approx(2 * BYTES / r["iter_time_s"] / 2, rel=1e-6)


def test_ssgd_ps_with_a_dedicated_shard_equals_its_schedule_by_hand() -> None:
    # node 0: both workers; node 1: the shard. Both pushes share node 0's uplink (and
    # node 1's downlink): their latencies pass together, their bytes queue, ALPHA + 2 BYTES;
    # the update; both pulls share node 1's uplink likewise and end together (sent at once,
    # as the shard does), so neither computes before the other.
    r = _predict("ssgd", _placed(2, 1, 2, "dedicated"))
    round_s = 2 * (ALPHA + 2 * BYTES)
    assert r["iter_time_s"] == pytest.approx(COMPUTE + round_s + SERVER + UNPACK, rel=1e-9)
    assert r["comm_s"] == pytest.approx(round_s + SERVER, rel=1e-9)


def test_odsgd_and_asgd_by_placement_equal_their_pipelines_by_hand() -> None:
    local = COMPUTE + UNPACK + UPDATE  # OD-SGD's worker side of an iteration
    # OD-SGD overlaps the round with the next step's compute: the slower of the two.
    colocated = _predict("odsgd", _placed(2, 1, 2, "colocated"))
    assert colocated["iter_time_s"] == pytest.approx(max(local, 2 * T + SERVER), rel=1e-6)
    dedicated = _predict("odsgd", _placed(2, 1, 2, "dedicated"))
    assert dedicated["iter_time_s"] == pytest.approx(max(local, 2 * (ALPHA + 2 * BYTES) + SERVER), rel=1e-6)


def test_a_shards_first_pull_is_back_by_the_lead_the_microbenchmark_measured_and_its_push_follows() -> None:
    """A shard node's uplink (a FIFO queue) serves pulls sent at once unfairly: the
    microbenchmark times the first remote worker back `lead` before the last (pull_lead_s).
    Node 0: worker 0, node 1: worker 1, node 2: the shard. With the lead, worker 0 computes
    `lead` sooner, and its push takes the shard's downlink that much sooner: SSGD's iteration
    is `lead` shorter. OD-SGD's next push waits only for its own pull (gloo sends once its
    receiver has said so, on the one connection, behind the pull), where the shard's sends fit
    the socket and its loop is back at receive at once: its round is `lead` shorter too.
    Without the measurement (an older comm.json), the pulls end together, as before."""
    lead = 0.25 * BYTES
    node_of_rank = _placed(2, 1, 3, "dedicated")
    raw = _ps_comm(node_of_rank)
    raw["environment"]["tcp_wmem_max"] = 16 << 20  # the shard's 4 MB sends fit its sockets' buffers
    rows = [r | {"pull_lead_s": lead} if r["primitive"] == "ps" else r for r in raw["measurements"]]
    timed = {**raw, "measurements": rows}
    assert CommCosts(fit_comm(timed)).pull_lead(2, 1)(M) == pytest.approx(lead, rel=1e-9)
    assert CommCosts(fit_comm(raw)).pull_lead(2, 1) is None
    # Per size as measured: a negative median (the order flipped) is no lead, and between two
    # sizes the line between them; a near-zero value does not bend its neighbours'.
    by_size = dict(zip(SIZES, [-2e-5, 1e-5, 1e-4, 1e-3, 2e-3, 4e-3, -1e-3], strict=True))
    measured = [r | {"pull_lead_s": by_size[r["bytes"]]} if r["primitive"] == "ps" else r for r in raw["measurements"]]
    lead_of = CommCosts(fit_comm({**raw, "measurements": measured})).pull_lead(2, 1)
    assert lead_of(SIZES[0]) == 0.0 and lead_of(SIZES[-1]) == 0.0 and lead_of(10 * SIZES[-1]) == 0.0
    assert lead_of(SIZES[3]) == pytest.approx(1e-3, rel=1e-9)
    assert lead_of((SIZES[4] + SIZES[5]) / 2) == pytest.approx(3e-3, rel=1e-9)
    assert CommCosts(fit_comm(timed), bandwidth_bytes_per_s=LINK / 2).pull_lead(2, 1) is None  # another rate

    def iteration(algorithm: str, comm: dict) -> float:
        return _iteration(algorithm, comm, node_of_rank)

    round_s = 2 * (ALPHA + 2 * BYTES)
    assert iteration("ssgd", raw) == pytest.approx(COMPUTE + round_s + SERVER + UNPACK, rel=1e-9)
    assert iteration("ssgd", timed) == pytest.approx(COMPUTE + round_s + SERVER + UNPACK - lead, rel=1e-9)
    assert iteration("odsgd", raw) == pytest.approx(round_s + SERVER, rel=1e-6)
    assert iteration("odsgd", timed) == pytest.approx(round_s + SERVER - lead, rel=1e-6)
    # A lead longer than a pull is FIFO order at most: the first back after its own bytes.
    rows = [r | {"pull_lead_s": 3 * BYTES} if r["primitive"] == "ps" else r for r in raw["measurements"]]
    assert iteration("ssgd", {**raw, "measurements": rows}) < iteration("ssgd", timed)


@settings(max_examples=30, deadline=None)
@given(held=st.floats(0.01, 1.0), lead_frac=st.floats(0.05, 0.9))
def test_a_shard_is_back_at_receive_once_the_kernel_holds_the_rest_of_its_pulls(held: float, lead_frac: float) -> None:
    """The shard posts its next receives once its sends of the pulls have returned, and a send
    returns once the kernel holds the rest of its bytes: `held` of the two pulls' bytes (the
    send buffer here, half of tcp_wmem's ceiling) is still on the link then. OD-SGD's first
    worker back pushes at the later of its own pull (`lead` before the last) and the shard's
    return (the last pull's latency and the held bytes' wire time before the last's end), so
    the round is shorter by the smaller of the two; a shard whose sends the kernel holds
    whole waits for nothing but the pull, whatever their size."""
    lead = lead_frac * BYTES
    node_of_rank = _placed(2, 1, 3, "dedicated")
    raw = _ps_comm(node_of_rank)
    raw["environment"]["tcp_wmem_max"] = int(2 * held * 2 * M)
    rows = [r | {"pull_lead_s": lead} if r["primitive"] == "ps" else r for r in raw["measurements"]]
    round_s = 2 * (ALPHA + 2 * BYTES)
    got = _iteration("odsgd", {**raw, "measurements": rows}, node_of_rank)
    assert got == pytest.approx(round_s + SERVER - min(lead, ALPHA + held * 2 * BYTES), rel=1e-6)


def test_asgd_on_a_dedicated_shard_node_replies_through_the_socket_buffer() -> None:
    """The shard serves one push at a time (receive, apply, reply) and goes back to receiving
    once its socket has taken the reply: all but the last half of Linux's 4 MiB send-buffer
    ceiling (2 MiB), which the link carries at its byte time after the shard has gone on.
    Both workers on node 0, the shard alone on node 1; M = 4 MB."""
    node_of_rank = _placed(2, 1, 2, "dedicated")
    assert node_of_rank == (0, 0, 1)
    held = 2**21 * BETA  # the buffered bytes' time on the link, after the shard has gone on
    serve = T + APPLY + T - held  # the shard's pass: the push, apply, the blocking part
    worker = COMPUTE + serve + held + UNPACK  # a worker's cycle, the shard free
    asgd = _predict("asgd", node_of_rank)
    assert 2 * serve > worker  # here the shard's loop sets the pace: two passes per round
    assert asgd["iter_time_s"] == pytest.approx(2 * serve, rel=1e-6)
    # A ceiling of 16 MiB takes the whole reply: the pass is the push and apply alone, and the
    # workers' own cycle (compute, push, apply, the reply on the link, unpack) sets the pace.
    roomy = _predict("asgd", node_of_rank, tcp_wmem_max=16 * 2**20)
    assert 2 * (T + APPLY) < COMPUTE + 2 * T + APPLY + UNPACK
    assert roomy["iter_time_s"] == pytest.approx(COMPUTE + 2 * T + APPLY + UNPACK, rel=1e-6)


def test_a_colocated_shards_own_workers_pay_the_p2p_latency_not_the_rounds_small_size_floor() -> None:
    """The microbenchmark's PS round is timed to its remote worker, and at small sizes it holds
    the host's scheduling delays (on the 2-core VM at 1 Gbit/s: 2-4 ms at 4 KiB, where the
    ping-pong's one-way latency was 0.2 ms). Worker 0 beside its shard crosses no link: its push
    and pull cost the p2p fit's latency, not the round's cost extrapolated to 0 bytes."""
    node_of_rank = _placed(2, 1, 2, "colocated")
    raw = _ps_comm(node_of_rank)
    floor = 3e-3
    for row in raw["measurements"]:
        if row["primitive"] == "ps" and row["bytes"] <= 65536:
            row["median_s"] += floor
    comm = CommCosts(fit_comm(raw, link_bytes_per_s=LINK))
    scenario = Scenario.of("t", algorithm="ssgd", comm="ps", workers=2, servers=1, node_of_rank=node_of_rank)
    costs = build_costs(TABLE, comm, scenario)
    assert costs.wire.transfer_s(0) > floor / 4  # the round's floor, which the old rule charged worker 0
    assert costs.wire.local_transfer_s == pytest.approx(ALPHA, rel=1e-6)
    dag = build_plan(costs, scenario).dag
    comm_tasks = [(o, d) for n, o, d in zip(dag.names, dag.owners, dag.durations, strict=True)
                  if n in ("push s0", "pull s0") and d > 0]
    local = {d for o, d in comm_tasks if o == "worker0"}
    remote = {round(d, 9) for o, d in comm_tasks if o == "worker1"}
    assert local and all(d == pytest.approx(ALPHA, rel=1e-6) for d in local)
    assert remote and min(remote) > 10 * ALPHA  # worker 1's bytes cross the link


def test_asgd_beside_a_colocated_shard_keeps_two_paces() -> None:
    """Worker 0 shares the shard's node and reaches it in a memory copy (the p2p latency), so
    its pass holds the shard's loop throughout; worker 1 crosses the link both ways, and the
    shard goes back to receiving once its socket has taken all but the buffered part of the
    reply. Worker 1's cycle sets its own pace; worker 0 steps whenever the shard is free."""
    asgd = _predict("asgd", _placed(2, 1, 2, "colocated"))
    buffered = 2**21 / M
    remote_pass = T + APPLY + (1 - buffered) * T  # the shard's loop, held by worker 1's push and reply
    local_pass = 2 * ALPHA + APPLY
    local_cycle = COMPUTE + local_pass + UNPACK
    slow = COMPUTE + 2 * T + APPLY + UNPACK  # worker 1: compute, push, apply, the reply, unpack
    free = slow - remote_pass  # the shard's time for worker 0 in each of worker 1's cycles
    # Three of worker 0's cycles start in it, a fourth does not: three passes per slow cycle.
    assert 2 * local_cycle + local_pass <= free < 3 * local_cycle + local_pass
    assert asgd["iter_time_s"] == pytest.approx((slow + slow / 3) / 2, rel=1e-6)


def test_two_paces_are_read_over_the_window_every_worker_runs_in() -> None:
    """The measured side's rule, which the model's periods share: worker 0 alternates short and
    long iterations (two per 90 ms of worker 1's) and runs on alone after worker 1 stops; its
    pace is two per worker 1's cycle, not its median iteration nor its steps after the end."""
    fast = [0.0]
    for _ in range(12):
        fast += [fast[-1] + 0.01, fast[-1] + 0.09]
    fast += [fast[-1] + 0.01 * i for i in range(1, 20)]  # alone: 10 ms steps
    slow = [0.09 * i for i in range(13)]
    p0, p1 = shared_paces([fast, slow])
    assert p1 == pytest.approx(0.09, rel=1e-9)
    assert p0 == pytest.approx(0.045, rel=1e-9)
    assert statistics.median(b - a for a, b in itertools.pairwise(fast)) != pytest.approx(p0, rel=0.1)
    # The last quarter of the window (two of worker 1's cycles): the same paces.
    assert shared_paces([fast, slow], last=0.25) == pytest.approx([0.045, 0.09], rel=1e-9)
    # The trainer's records: rank, step and end, warm-up steps skipped.
    records = [{"role": "worker", "rank": r, "step": i, "end": t}
               for r, ends in enumerate([fast, slow]) for i, t in enumerate(ends)]
    assert worker_paces(records, skip=2) == pytest.approx([0.045, 0.09], rel=1e-9)
    # Too short a shared window to tell: no figure, rather than a wrong one.
    assert shared_paces([[0.0, 1.0], [2.0, 3.0]]) is None
    assert shared_paces([[0.0], [0.0, 1.0]]) is None


@settings(max_examples=30, deadline=None)
@given(pause=st.floats(0.05, 2.0), during=st.floats(0.01, 0.2), at=st.integers(3, 15))
def test_an_evaluation_is_no_part_of_the_paces(pause: float, during: float, at: int) -> None:
    """The lead worker evaluates after some steps: it stops stepping while the other steps on,
    at whatever pace a shard to itself gives (`during`). Neither is training: the paces read
    between the pauses are the training paces, 100 ms and 50 ms, however long the pause."""
    w0 = [0.1 * i for i in range(at + 1)]
    w1 = [0.05 * i for i in range(2 * at + 1)]
    t = w0[-1]
    w1 += [t + during * k for k in range(1, int(pause / during) + 1) if during * k < pause]
    w0 += [t + pause + 0.1 * i for i in range(1, 11)]
    w1 += [t + pause + 0.05 * i for i in range(0, 21)]
    paces = shared_paces([w0, w1], pauses=[[t, t + pause]])
    assert paces == pytest.approx([0.1, 0.05], rel=1e-9)
    evaluated = {"eval": [t, t + pause]}  # on the lead's record of the step it follows
    records = [{"role": "worker", "rank": r, "step": i, "end": e, **(evaluated if (r, i) == (0, at) else {})}
               for r, ends in enumerate([w0, w1]) for i, e in enumerate(ends)]
    assert worker_paces(records, skip=1) == pytest.approx([0.1, 0.05], rel=1e-9)
    # Read across the pause, the evaluating worker looks slower by it.
    assert shared_paces([w0, w1])[0] > 0.1 * (1 + 0.5 * pause / (w0[-1] - pause))


def test_placed_on_nodes_the_loopback_corrections_do_not_apply() -> None:
    """Measured in namespaces of one host (one hostname), the ranks still talk over links:
    no copying on the CPU, no host-core bound."""
    node_of_rank = _placed(2, 1, 3, "dedicated")
    comm = fit_comm(_ps_comm(node_of_rank))  # no link rate recorded: only the placement tells
    scenario = Scenario.of("t", algorithm="ssgd", comm="ps", workers=2, servers=1, node_of_rank=node_of_rank)
    [r] = predict(TABLE, comm, scenario)
    assert r["host_cpu_bound_s"] == 0.0
    assert r["iter_time_s"] == pytest.approx(COMPUTE + 2 * (ALPHA + 2 * BYTES) + SERVER + UNPACK, rel=1e-6)
    # The timeline names the shard of every transfer, placed or not.
    records = predicted_timeline(TABLE, comm, scenario)
    assert {r["role"] for r in records} == {"worker", "server"}
    assert {r["rank"] for r in records if r["role"] == "server"} == {2}  # a class per node, then the shard


def test_a_placement_is_of_one_world_and_comes_from_the_summary() -> None:
    summary = {"algorithm": "ssgd", "comm": "ps", "workers": 2, "servers": 1, "batch_size": 32,
               "placement": place(2, 1, 2, "colocated").as_dict()}
    assert Scenario.from_summary(summary).node_of_rank == (0, 1, 0)
    with pytest.raises(ValueError, match="scenario.node_of_rank: places 3 ranks, but the job has 4 workers"):
        Scenario.from_summary(summary).with_workers(4)


@pytest.mark.parametrize(
    ("policy", "expected", "round_s"),
    [("colocated", (0, 1, 0), 2 * T), ("dedicated", (0, 1, 2), 2 * (ALPHA + 2 * BYTES))],
)
def test_the_predict_step_places_each_world_as_the_specs_provider_does(policy, expected, round_s) -> None:
    import yaml

    from pipelines.spec import validate_spec
    from pipelines.stages.grid import placements, predictions
    from pipelines.stages.runner import workload_dir

    values = yaml.safe_load((REPO / "specs" / "smoke.yaml").read_text())
    values["provider"] = {"name": "netns", "options": {"nodes": 3, "bandwidth": "1gbit", "placement": policy}}
    values["network"] = {"link_bandwidth": "1gbit"}
    values["algorithms"] = [{"name": "ssgd", "comm": "ps"}]
    spec = validate_spec(values, "smoke.yaml")
    placed = placements(spec, [2])
    assert placed[(2, 1)] == expected
    assert placed[(2, 0)] == (0, 1)  # allreduce: the workers only
    layers = {workload_dir(spec.workloads[0], 32): TABLE}
    rows = predictions(spec, layers, fit_comm(_ps_comm(expected), link_bytes_per_s=LINK))
    [row] = [r for r in rows if not r["what_if"]]
    assert row["iter_time_s"] == pytest.approx(COMPUTE + round_s + SERVER + UNPACK, rel=1e-6)


def test_odsgd_pays_for_posting_its_round_where_it_does_not_wait() -> None:
    """Posting the push and pull (gloo writes into the socket from the caller's thread) holds
    the worker's CPU: OD-SGD's next compute waits for it, SSGD's wait covers it. Measured per
    round by the microbenchmark (`post_s`), placed on nodes only (on one host the transfer's
    copying already holds the CPUs)."""
    post = 1.5e-3
    small = 40_000  # a round of 2T + update well under the local step: OD-SGD is compute-bound
    table = layer_table([F], [B], [small], data=DATA, update=UPDATE, pack=PACK, unpack=UNPACK,
                        server_update=SERVER_UPDATE, server_add=SERVER_ADD)
    node_of_rank = _placed(2, 1, 2, "colocated")
    raw = _ps_comm(node_of_rank)
    rows = [r | {"post_s": post} if r["primitive"] == "ps" else r for r in raw["measurements"]]
    timed = {**raw, "measurements": rows}
    assert CommCosts(fit_comm(timed)).post(2, 1)(small) == pytest.approx(post, rel=1e-9)
    assert CommCosts(fit_comm(raw)).post(2, 1)(small) == 0.0  # an older comm.json: no post time
    # Past the largest size measured (a model larger than the microbenchmark's), the largest's.
    assert CommCosts(fit_comm(timed)).post(2, 1)(4 * SIZES[-1]) == pytest.approx(post, rel=1e-9)

    def iteration(algorithm: str, comm: dict) -> float:
        return _iteration(algorithm, comm, node_of_rank, table)

    local = COMPUTE + UNPACK + UPDATE
    assert iteration("odsgd", raw) == pytest.approx(local, rel=1e-6)
    assert iteration("odsgd", timed) == pytest.approx(local + post, rel=1e-6)
    assert iteration("ssgd", timed) == pytest.approx(iteration("ssgd", raw), rel=1e-12)


def test_on_an_emulated_cluster_the_hosts_cores_bound_the_iteration_by_measured_cpu() -> None:
    """Namespaces of one host: the ranks talk over links, but every rank and the kernel's
    network stack run on the host's 2 cores. The microbenchmark measured the host's CPU time
    of a ps round (host_cpu_s, a + b M here); an iteration takes at least all ranks' CPU
    time over the cores: both workers' steps, the round, the shard's update."""
    node_of_rank = _placed(2, 1, 2, "colocated")
    raw = _ps_comm(node_of_rank)
    cpu_a, cpu_b = 2e-3, 30e-9
    for row in raw["measurements"]:
        if row["primitive"] == "ps":
            row["host_cpu_s"] = cpu_a + cpu_b * row["bytes"]
    comm = fit_comm(raw, link_bytes_per_s=LINK)
    assert CommCosts(comm).host_cpu("ps", 2, 1)(M) == pytest.approx(cpu_a + cpu_b * M, rel=1e-9)
    odsgd = Scenario.of("t", algorithm="odsgd", comm="ps", workers=2, servers=1, node_of_rank=node_of_rank)
    [r] = predict(TABLE, comm, odsgd)
    worker = DATA + F + B + PACK + UNPACK + UPDATE  # OD-SGD's worker: its local update too
    bound = (2 * worker + cpu_a + cpu_b * M + SERVER) / 2
    assert bound > 2 * T + SERVER  # the links alone would allow less (the by-hand schedule above)
    assert r["host_cpu_bound_s"] == pytest.approx(bound, rel=1e-9)
    assert r["iter_time_s"] == pytest.approx(bound, rel=1e-9)
    # ASGD's shard applies each of the N pushes, and a worker has no local update.
    [a] = predict(TABLE, comm, odsgd.model_copy(update={"algorithm": "asgd"}))
    assert a["host_cpu_bound_s"] == pytest.approx((2 * (worker - UPDATE) + cpu_a + cpu_b * M + 2 * APPLY) / 2)
    # Ranks on hosts of their own (a real cluster), or a what-if link: the host's CPU is not shared.
    raw["environment"]["hosts"] = 3
    [real] = predict(TABLE, fit_comm(raw, link_bytes_per_s=LINK), odsgd)
    assert real["host_cpu_bound_s"] == 0.0 and real["iter_time_s"] == pytest.approx(2 * T + SERVER, rel=1e-6)
    [what_if] = predict(TABLE, comm, odsgd.model_copy(update={"bandwidth_bytes_per_s": LINK / 2}))
    assert what_if["host_cpu_bound_s"] == 0.0  # other links, other hosts: nothing measured here holds
    [stated] = predict(TABLE, comm, odsgd.model_copy(update={"bandwidth_bytes_per_s": LINK}))
    assert stated == predict(TABLE, comm, odsgd)[0]  # the measured links' rate stated again: those links


def _one_host_comm(node_of_rank: tuple[int, ...]) -> dict:
    """The fit of a microbenchmark of 4 workers and a shard on namespaces of one host: host CPU
    measured, as there, where the host's cores run every rank."""
    raw = _ps_comm(node_of_rank, workers=4)
    for row in raw["measurements"]:
        row["host_cpu_s"] = 1e-4
    raw["environment"]["world_size"] = 5
    return fit_comm(raw, link_bytes_per_s=LINK)


def test_on_an_emulated_cluster_the_ranks_computing_at_each_moment_share_the_hosts_cores() -> None:
    """Namespaces of one host of 2 cores, 4 workers and a shard: the profile timed 4 processes
    computing at once, each at 2/4 of its speed, so a computation's work at full speed is half
    its profiled time. A ring's 4 workers compute at once, each at 2/4 again: as profiled. A
    shard's pulls come back to its own node's 2 workers at once and to the other node's 2 a
    link's queue later; each pair then computes alone on the 2 cores, at full speed. Compute
    timed in situ ran as training shared the cores, and is taken as it is."""
    node_of_rank = _placed(4, 1, 2, "colocated")
    comm = _one_host_comm(node_of_rank)
    profiled = TABLE | {"processes": 4, "environment": {"cpu_count": 2, "processes": 4}}
    ring = Scenario.of("t", algorithm="ssgd", comm="allreduce", workers=4, servers=0, node_of_rank=node_of_rank[:4])
    [r] = predict(profiled, comm, ring)
    assert r["compute_s"] == pytest.approx(DATA + F + B + UNPACK + UPDATE, rel=1e-9)
    ps = Scenario.of("t", algorithm="ssgd", comm="ps", workers=4, servers=1, node_of_rank=node_of_rank)
    [alone] = predict(profiled, comm, ps)
    assert 2 * T < alone["iter_time_s"]  # the far pair's pulls queue on one uplink: longer than the work
    assert alone["compute_s"] == pytest.approx((DATA + F + B + PACK + UNPACK) * 2 / 4, rel=1e-9)
    [insitu] = predict(profiled | {"source": "in situ"}, comm, ps)
    assert insitu["compute_s"] == pytest.approx(DATA + F + B + PACK + UNPACK, rel=1e-9)
    # On the round's critical path: the far pair's turn and the shard's update, each at full
    # speed where profiled, twice that where taken as timed.
    turn, update = DATA + F + B + PACK + UNPACK, SERVER_UPDATE + 3 * SERVER_ADD
    assert insitu["iter_time_s"] - alone["iter_time_s"] == pytest.approx((turn + update) * 2 / 4, rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(samples=st.lists(st.floats(0.5 * T, 3 * T), min_size=2, max_size=12), processes=st.integers(1, 6))
def test_a_profile_that_outnumbered_its_cores_gives_no_straggler_on_shared_cores(
    samples: list[float], processes: int
) -> None:
    """A ring's 4 workers on an emulated cluster of one 2-core host. A profile of more processes
    than cores timed them served in turn: the spread of its iterations is that order, and ranks
    computing at once end together by when their work is done, so a barrier waits for nothing
    beyond it. A profile of as many processes as cores or fewer timed each on a core of its own:
    its spread is the work's own, and the barrier waits for the slowest of the 4."""
    node_of_rank = _placed(4, 1, 2, "colocated")
    comm = _one_host_comm(node_of_rank)
    ring = Scenario.of("t", algorithm="ssgd", comm="allreduce", workers=4, servers=0, node_of_rank=node_of_rank[:4])
    profiled = TABLE | {"processes": processes, "environment": {"cpu_count": 2, "processes": processes}}
    [steady] = predict(profiled, comm, ring)
    [jittery] = predict(profiled | {"iteration_samples_s": samples}, comm, ring)
    own_cores = processes <= 2
    straggle = expected_straggle(samples, 4) if own_cores else 0.0
    assert jittery["compute_s"] - steady["compute_s"] == pytest.approx(straggle, rel=1e-6, abs=1e-12)


def _with_asgd_passes(raw: dict, passes, node_of_rank=None, tails=None) -> dict:
    """comm.json with ASGD passes timed per worker (`passes`: one bytes -> seconds per worker;
    `tails`: the same for each reply's time on the link after the shard's send returned)."""
    for m in SIZES:
        per_worker = [p(m) for p in passes]
        raw["measurements"].append({"primitive": "asgd", "workers": 2, "servers": 1, "bytes": m,
                                    "median_s": max(per_worker), "times_s": per_worker, "worker_mean_s": per_worker,
                                    **({"reply_tail_s": [f(m) for f in tails]} if tails else {}),
                                    **({"node_of_rank": list(node_of_rank)} if node_of_rank else {})})
    return raw


@settings(max_examples=40, deadline=None)
@given(held=st.floats(SIZES[0], SIZES[-1]), reply=st.floats(SIZES[0], SIZES[-1]))
def test_an_asgd_replys_tail_is_what_the_kernel_holds_of_it(held: float, reply: float) -> None:
    """A send returns once the kernel holds the rest of the reply (socket buffer, qdisc queue,
    TCP window: `held` bytes), so the link carries min(reply, held) after it: rising with the
    reply, then flat. The microbenchmark times that tail at its sizes; at any size between them
    the model's tail, capped at the reply's own time on the link, is min(reply, held) at the
    link's byte time. (A line through the sizes fell short across the bend: 2-core netns, 150
    Mbit/s, 2.9 MB replies, ASGD over-predicted by the shard's extra blocking.)"""
    node_of_rank = _placed(2, 1, 2, "dedicated")
    far = lambda m: 2 * (ALPHA + m * BETA)  # noqa: E731
    tails = [lambda m: min(m, held) * BETA] * 2
    raw = _with_asgd_passes(_ps_comm(node_of_rank), [far, far], node_of_rank, tails=tails)
    scenario = Scenario.of("t", algorithm="asgd", comm="ps", workers=2, servers=1, node_of_rank=node_of_rank)
    from modelling.network.fabric import Fabric

    costs = build_costs(TABLE, CommCosts(fit_comm(raw, link_bytes_per_s=LINK)), scenario)
    # The fabric's own figure (its cap at the reply's wire time included), not the test's copy
    # of it: both workers on node 0 are one class.
    fabric = Fabric(costs, 2, 1)
    assert fabric.first_worker == [0]
    assert fabric._held_s(0, reply, reply * BETA) == pytest.approx(min(reply, held) * BETA, rel=1e-9)


def test_asgd_replies_stay_on_the_link_for_the_tail_the_microbenchmark_measured() -> None:
    """Over a 1 Gbit/s netns link the shard's send of mlp's 21 MB reply returned about 29 ms
    before the worker had it, where half of tcp_wmem's ceiling gives 17 ms: tbf's queue and
    TCP's window hold bytes too. Measured, the tail is the reply's part that holds the links
    after the shard has gone on. Both workers on node 0, the shard on node 1; each pass (push
    and reply) is `far`, half of it a transfer."""
    node_of_rank = _placed(2, 1, 2, "dedicated")
    far = lambda m: 2e-3 + m * 4e-9  # noqa: E731
    tail = 1e-3
    half = far(M) / 2
    raw = _with_asgd_passes(_ps_comm(node_of_rank), [far, far], node_of_rank, tails=[lambda m: tail] * 2)
    scenario = Scenario.of("t", algorithm="asgd", comm="ps", workers=2, servers=1, node_of_rank=node_of_rank)
    model = fit_comm(raw, link_bytes_per_s=LINK)
    costs = build_costs(TABLE, CommCosts(model), scenario)
    assert [f(M) for f in costs.wire.asgd_reply_tail_s] == pytest.approx([tail, tail], rel=1e-6)
    serve = half + APPLY + half - tail  # the shard's pass: the push, apply, the reply less its tail
    worker = COMPUTE + serve + tail + UNPACK  # a worker's cycle, the shard free
    assert 2 * serve > worker  # the shard's loop sets the pace: two passes per round
    [r] = predict(TABLE, model, scenario)
    assert r["iter_time_s"] == pytest.approx(2 * serve, rel=1e-6)
    # Without the measured tails, half of Linux's 4 MiB ceiling (2 MiB of the 4 MB reply) goes
    # on while the shard serves on: the shard is free sooner and the workers' cycle sets the pace.
    for row in raw["measurements"]:
        row.pop("reply_tail_s", None)
    [socket] = predict(TABLE, fit_comm(raw, link_bytes_per_s=LINK), scenario)
    held = 2**21 * BETA
    assert 2 * (2 * half - held + APPLY) < COMPUTE + 2 * half + APPLY + UNPACK
    assert socket["iter_time_s"] == pytest.approx(COMPUTE + 2 * half + APPLY + UNPACK, rel=1e-6)
    # A what-if bandwidth (other links) uses no tail measured on these; their own rate stated is them.
    assert build_costs(TABLE, CommCosts(model, LINK / 2), scenario).wire.asgd_reply_tail_s is None
    assert build_costs(TABLE, CommCosts(model, LINK), scenario).wire.asgd_reply_tail_s is not None


def test_asgd_passes_as_the_microbenchmark_timed_them_in_asgds_own_pattern() -> None:
    """A synchronous round hides what one worker's push and pull cost while the others compute
    (on 2 cores the shard then waits for a core). Timed in ASGD's pattern, each worker's pass is
    its push and the reply: the DAG's pass is that, plus the shard's apply."""
    near, far = (lambda m: 1e-3 + m * 1e-10), (lambda m: 2e-3 + m * 1e-9)
    # One host (no link rate, no placement): the slower worker's cycle sets the pace.
    comm = fit_comm(_with_asgd_passes(synthetic_comm(ALPHA, BETA, 0.0, workers=2), [far, far]))
    one_host = Scenario.of("t", algorithm="asgd", comm="ps", workers=2, servers=1)
    costs = build_costs(TABLE, CommCosts(comm), one_host)
    assert [p(M) for p in costs.wire.asgd_pass_s] == pytest.approx([far(M)] * 2, rel=1e-6)
    [r] = predict(TABLE, comm, one_host)
    assert 2 * (far(M) + APPLY) < COMPUTE + far(M) + APPLY + UNPACK  # the shard keeps up: no queue
    assert r["iter_time_s"] == pytest.approx(COMPUTE + far(M) + APPLY + UNPACK, rel=1e-6)
    # The same world with a what-if link: the transfers from the fit, not the passes measured.
    assert build_costs(TABLE, CommCosts(comm, LINK), one_host).wire.asgd_pass_s is None
    # Colocated: worker 0 beside the shard passes within its node; worker 1 across the link
    # (the schedule they give: the next test).
    node_of_rank = _placed(2, 1, 2, "colocated")
    raw = _with_asgd_passes(_ps_comm(node_of_rank), [near, far], node_of_rank)
    placed = Scenario.of("t", algorithm="asgd", comm="ps", workers=2, servers=1, node_of_rank=node_of_rank)
    costs = build_costs(TABLE, CommCosts(fit_comm(raw, link_bytes_per_s=LINK)), placed)
    assert [p(M) for p in costs.wire.asgd_pass_s] == pytest.approx([near(M), far(M)], rel=1e-6)


def test_a_push_that_waits_for_a_colocated_shard_passes_sooner_and_wins_the_race() -> None:
    """mlp's ASGD beside a colocated shard at 1 Gbit/s: after worker 1's pass, the shard
    served worker 0's waiting push in 14 ms (its bytes were in the loopback sockets' buffers),
    where a push that finds the shard free takes 21.5; worker 0's next push then reached the
    shard before worker 1's, and worker 0 stepped twice per step of worker 1. Hand-computed:
    worker 0 (beside the shard) passes in `near`, worker 1 across the link in `far`, whose
    reply holds the link `tail` after the shard has gone on."""
    node_of_rank = _placed(2, 1, 2, "colocated")
    near, far, tail = (lambda m: 2e-3), (lambda m: 2e-3 + m * 4e-9), 2e-3
    raw = _with_asgd_passes(_ps_comm(node_of_rank), [near, far], node_of_rank, tails=[lambda m: tail] * 2)
    scenario = Scenario.of("t", algorithm="asgd", comm="ps", workers=2, servers=1, node_of_rank=node_of_rank)
    model = fit_comm(raw, link_bytes_per_s=LINK)
    costs = build_costs(TABLE, CommCosts(model), scenario)
    assert costs.wire.socket_buffer_bytes == 2**21 + 3 * 2**20 > M  # Linux's defaults: the whole push
    free = near(M) + APPLY  # worker 0's pass when the shard is free: push, apply, reply
    waited = free - near(M) / 2  # and when its push waited: its half was in the buffers
    remote = far(M) / 2 + APPLY + far(M) / 2 - tail  # worker 1's pass, less the reply's tail
    cycle = UNPACK + COMPUTE  # from a reply to the next push
    assert waited < tail < free  # the race after worker 1's reply: worker 0's push first
    assert tail < waited + free and cycle < remote  # worker 1 waits; worker 0's next push too
    period = remote + waited + cycle + free  # the shard: worker 1, worker 0 twice, idle between
    [r] = predict(TABLE, model, scenario)
    assert r["iter_time_s"] == pytest.approx((period + period / 2) / 2, rel=1e-6)
    # A push that finds the shard free or one that waited, the same: worker 1's push is first,
    # and each of worker 0's waits out worker 1's pass: one pace.
    raw["environment"]["tcp_wmem_max"] = raw["environment"]["tcp_rmem_max"] = 2
    model = fit_comm(raw, link_bytes_per_s=LINK)
    assert build_costs(TABLE, CommCosts(model), scenario).wire.socket_buffer_bytes == 2
    [locked] = predict(TABLE, model, scenario)
    assert locked["iter_time_s"] == pytest.approx(tail + cycle + remote, rel=1e-6)


def _lapping_comm(rate: float) -> dict:
    """A 2-node colocated microbenchmark at `rate` bytes/s: worker 0 beside the shard, worker 1
    across a slow link (the issue's resnet20 at 75 Mbit/s)."""
    raw = _ps_comm(_placed(2, 1, 2, "colocated"))
    for row in raw["measurements"]:
        per_transfer = ALPHA + row["bytes"] / rate
        row["median_s"] = 2 * per_transfer if row["primitive"] == "ps" else per_transfer
    return fit_comm(raw, link_bytes_per_s=rate)


@pytest.mark.parametrize("mbit", [75, 20])
def test_an_asgd_worker_that_laps_the_others_is_a_pace_not_an_error(mbit: int) -> None:
    """Beside a colocated shard, worker 0 steps dozens of times per step of worker 1 across a
    slow link; unrolled alike, the communication-only schedule left no window in which both
    run ("no window in which every worker runs, over 64 unrolled iterations"). Each class is
    now unrolled by its pace: worker 1's period is its cycle by hand, and the figure is finite."""
    import modelling.predict as mp

    rate = mbit * 1e6 / 8
    node_of_rank = _placed(2, 1, 2, "colocated")
    comm = _lapping_comm(rate)
    scenario = Scenario.of("t", algorithm="asgd", comm="ps", workers=2, servers=1, node_of_rank=node_of_rank)
    [r] = predict(TABLE, comm, scenario)
    assert r["no_prediction"] is None
    t = ALPHA + M / rate
    costs = build_costs(TABLE, CommCosts(comm), mp.decided_scenario(scenario, comm))
    for c in (costs, mp.without_compute(costs)):
        plan, _, paces = mp._steady_state(c, mp.decided_scenario(scenario, comm))
        assert paces["worker0"] < paces["worker1"] / 10  # it laps worker 1
    _, _, paces = mp._steady_state(costs, mp.decided_scenario(scenario, comm))
    assert paces["worker1"] == pytest.approx(COMPUTE + 2 * t + APPLY + UNPACK, rel=1e-6)
    assert r["iter_time_s"] == pytest.approx((paces["worker0"] + paces["worker1"]) / 2, rel=1e-9)
    # Worker 0 waits for the shard that worker 1's passes hold, so the mean exceeds compute +
    # the mean of the classes' communication; the slowest class's bounds it.
    assert max(r["compute_s"], r["comm_s"]) <= r["iter_time_s"] <= r["compute_s"] + r["comm_max_s"]


@pytest.mark.parametrize(
    ("workers", "servers", "nodes", "policy", "kw", "link", "loopback"),
    [
        (2, 1, 1, "colocated", {}, (0, 1), None),  # one host: loopback is the only class
        (2, 1, 2, "colocated", {}, (0, 1), (0, 2)),  # [w0 s2 | w1]: the shard beside worker 0
        (4, 1, 3, "colocated", {}, (0, 2), (0, 1)),  # [2, 1, 1]: ranks 0 and 1 share node 0
        (4, 0, 2, "colocated", {}, (0, 2), (0, 1)),  # [2, 2] allreduce
        (2, 1, 3, "dedicated", {}, (0, 1), None),  # one worker per node, the shard alone
        (1, 1, 2, "dedicated", {}, (0, 1), None),  # one worker: worker and shard cross the link
        (4, 1, 3, "colocated", {"devices_per_node": 4}, (0, 1), None),  # the whole job on node 0
        (4, 1, 2, "dedicated", {"devices_per_node": 4}, (0, 4), (0, 1)),  # workers on node 0, the shard on 1
    ],
)
def test_the_microbenchmark_times_a_pair_for_each_link_class_of_the_placement(
        workers, servers, nodes, policy, kw, link, loopback) -> None:
    from modelling.measure.links import p2p_pairs

    node_of_rank = place(workers, servers, nodes, policy, **kw).node_of_rank
    pairs = p2p_pairs(workers, node_of_rank if nodes > 1 else None)
    assert pairs.get("p2p") == link and pairs.get("loopback") == loopback
    a, b = pairs["p2p"]
    assert len(set(node_of_rank)) == 1 or node_of_rank[a] != node_of_rank[b]  # the link pair crosses nodes
    if loopback:
        assert node_of_rank[loopback[0]] == node_of_rank[loopback[1]]


def test_a_loopback_pair_is_fitted_apart_and_sets_a_local_transfers_latency() -> None:
    """A comm.json with a ping-pong within a node (primitive 'loopback') beside the link's:
    the loopback fit is not held to the link's rate, and a colocated shard's own workers pay
    its latency, not the link pair's."""
    raw = _ps_comm(_placed(2, 1, 2, "colocated"))
    for m in SIZES:
        raw["measurements"].append({"primitive": "loopback", "workers": 2, "servers": 0, "bytes": m,
                                    "median_s": 5e-6 + m * 0.2e-9, "pair": [0, 2]})
    model = fit_comm(raw, link_bytes_per_s=LINK)
    loop = next(f for f in model["fits"] if f["primitive"] == "loopback")
    assert loop["usable"] and loop["alpha_s"] == pytest.approx(5e-6, rel=1e-3)
    assert CommCosts(model).loopback_latency() == pytest.approx(5e-6, rel=1e-3)
    assert CommCosts(fit_comm(_ps_comm(_placed(2, 1, 2, "colocated")), link_bytes_per_s=LINK)
                     ).loopback_latency() == pytest.approx(ALPHA, rel=1e-3)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 64), st.integers(0, 4), st.integers(1, 6), st.sampled_from(["colocated", "dedicated"]),
       st.sampled_from([None, 1, 2, 4, 16]))
def test_every_placement_times_each_link_class_it_uses(workers, servers, nodes, policy, per_node) -> None:
    """Any placement (even, uneven, dedicated, devices_per_node): the link pair crosses nodes
    wherever the job spans several, and a loopback pair is timed wherever some node runs two
    ranks; every pair is two distinct ranks of the job, workers where workers can serve."""
    from infra.placement import PlacementError
    from modelling.measure.links import p2p_pairs

    try:
        node_of_rank = place(workers, servers, nodes, policy, devices_per_node=per_node).node_of_rank
    except PlacementError:
        return
    if workers + servers < 2:
        return
    pairs = p2p_pairs(workers, node_of_rank)
    spans = len(set(node_of_rank)) > 1
    for a, b in pairs.values():
        assert 0 <= a < b < len(node_of_rank)
    a, b = pairs["p2p"]
    assert (node_of_rank[a] != node_of_rank[b]) == spans
    worker_nodes = set(node_of_rank[:workers])
    if spans and len(worker_nodes) > 1:
        assert b < workers  # two workers, as a ring step crosses
    shared = any(node_of_rank.count(n) > 1 for n in set(node_of_rank))
    assert ("loopback" in pairs) == (spans and shared)
    if "loopback" in pairs:
        a, b = pairs["loopback"]
        assert node_of_rank[a] == node_of_rank[b]


def _bucket_comm(bucket: float, rate: float, nodes: int = 2) -> dict:
    """A microbenchmark across a shaped link whose token bucket of `bucket` bytes refills in
    the gap: every send of m bytes takes ALPHA + max(0, m - bucket) / rate; the ps round too,
    so its fit is flagged faster than the link and its transfers are charged the link's rate."""
    raw = _ps_comm(_placed(2, 1, nodes, "colocated"))
    for row in raw["measurements"]:
        if row["primitive"] in ("p2p", "ps"):
            one = ALPHA + max(0.0, row["bytes"] / (2 if row["primitive"] == "ps" else 1) - bucket) / rate
            row["median_s"] = row["times_s"][0] = one * (2 if row["primitive"] == "ps" else 1)
    return raw


@settings(max_examples=30, deadline=None)
@given(bucket_mb=st.floats(1.2, 3.9), gbit=st.floats(0.1, 10.0))  # both largest sends (4, 16 MiB) past it
def test_a_links_token_bucket_is_measured_by_the_largest_sends_past_their_latency(bucket_mb: float,
                                                                                  gbit: float) -> None:
    """The bucket the sends meet after the gap: the largest send's byte time less what it took past
    the smallest; none for another rate (what-if links), another path (sends faster than
    the link), or one node."""
    rate, bucket = gbit * 1e9 / 8, bucket_mb * 2**20
    model = fit_comm(_bucket_comm(bucket, rate), link_bytes_per_s=rate)
    ps = next(f for f in model["fits"] if f["primitive"] == "ps")
    assert not ps["usable"]  # the bucket tilts the round's slope below the link's byte time
    burst = (bucket - SIZES[0]) / rate  # short by the smallest send's bytes, which the bucket passed
    assert CommCosts(model).link_burst(2, 1) == pytest.approx(burst, rel=1e-9)
    assert CommCosts(model, rate).link_burst(2, 1) == pytest.approx(burst, rel=1e-9)
    assert CommCosts(model, rate / 2).link_burst(2, 1) == 0.0
    for faster in (10.0, 1.05):  # another path; a link faster than stated
        fast = fit_comm(_bucket_comm(bucket, rate * faster), link_bytes_per_s=rate)
        assert CommCosts(fast).link_burst(2, 1) == 0.0
    past = _bucket_comm(5 * 2**20, rate)  # past the second largest send: no line to read it by
    assert CommCosts(fit_comm(past, link_bytes_per_s=rate)).link_burst(2, 1) == 0.0
    one = _bucket_comm(bucket, rate)
    one["environment"]["nodes"] = 1
    assert CommCosts(fit_comm(one, link_bytes_per_s=rate)).link_burst(2, 1) == 0.0


@settings(max_examples=30, deadline=None)
@given(bucket_mb=st.floats(0.0, 3.9), gbit=st.floats(0.1, 10.0))
def test_a_transfer_across_the_link_holds_it_for_its_bytes_past_the_bucket(bucket_mb: float, gbit: float) -> None:
    """SSGD-PS, the shard beside worker 0: worker 1's push and pull each hold the link for their
    bytes' time less the bucket the link gathered while the worker computed, never less than 0."""
    from modelling.network.fabric import Fabric

    rate, bucket = gbit * 1e9 / 8, bucket_mb * 2**20
    if bucket_mb <= 1.2:  # no bucket: every send at the stated link's rate
        rate, raw = LINK, _ps_comm(_placed(2, 1, 2, "colocated"))
    else:
        raw = _bucket_comm(bucket, rate)
    scenario = Scenario.of("t", algorithm="ssgd", comm="ps", workers=2, servers=1,
                           node_of_rank=_placed(2, 1, 2, "colocated"))
    costs = build_costs(TABLE, CommCosts(fit_comm(raw, link_bytes_per_s=rate)), scenario)
    fab = Fabric(costs, 2, 1)
    remote = next(k for k in range(len(fab.mult)) if fab.link_class(k, 0) == "link")
    burst = costs.wire.link_burst_s
    assert burst == (pytest.approx((bucket - SIZES[0]) / rate, rel=1e-9) if bucket_mb > 1.2 else 0.0)
    for push in (True, False):
        t = fab.ps(remote, 0, push)
        one = costs.wire.transfer_s(fab.shard_bytes[0])
        assert t.wire_s == pytest.approx(max(one - t.latency_s - burst, 0.0), rel=1e-9, abs=1e-12)
