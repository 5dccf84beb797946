"""The DAG simulator against hand-computed schedules and DESIGN §3's closed forms."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from modelling.dag import Costs, build_allreduce, ddp_buckets
from modelling.network.wire import Wire
from modelling.simulate import Dag, critical_path, simulate


def test_one_resource_serves_one_task_at_a_time_in_ready_order() -> None:
    dag = Dag()
    a = dag.add("a", 2.0, ("cpu",))
    b = dag.add("b", 1.0, ("net",), (a,))  # ready at 2
    c = dag.add("c", 3.0, ("cpu",), (a,))  # ready at 2, cpu free at 2
    d = dag.add("d", 1.0, ("net",))  # ready at 0: before b
    e = dag.add("e", 1.0, ("net",), (c,))  # ready at 5
    s = simulate(dag)
    assert (s.start[a], s.end[a]) == (0.0, 2.0)
    assert (s.start[d], s.end[d]) == (0.0, 1.0)
    assert (s.start[b], s.end[b]) == (2.0, 3.0)
    assert (s.start[c], s.end[c]) == (2.0, 5.0)
    assert (s.start[e], s.end[e]) == (5.0, 6.0)
    assert critical_path(dag, s, e) == [a, c, e]


def test_a_transfer_holds_both_links_and_queues_behind_either() -> None:
    dag = Dag()
    p0 = dag.add("push w0", 2.0, ("w0.link", "s0.link"))
    p1 = dag.add("push w1", 2.0, ("w1.link", "s0.link"))  # queues on the shard's link
    q = dag.add("other w1", 1.0, ("w1.link",))  # ready at 0 but w1's link is reserved to 4
    u = dag.add("update", 0.5, ("s0.compute",), (p0, p1))
    s = simulate(dag)
    assert (s.start[p1], s.end[p1]) == (2.0, 4.0)
    assert (s.start[q], s.end[q]) == (4.0, 5.0)
    assert (s.start[u], s.end[u]) == (4.0, 4.5)
    assert critical_path(dag, s, u) == [p0, p1, u]


def test_a_wait_absorbs_at_most_what_the_task_could_do_before_its_resource_was_free() -> None:
    """A push that waits for its shard is partly in the socket buffers when the shard takes it:
    its pass is shorter by what it absorbed, at most its wait; where it was served at once, or
    its wait was short, it pays the rest. The order of service is as without it."""
    dag = Dag()
    dag.add("a", 3.0, ("shard",))
    b = dag.add("b", 2.0, ("shard",), absorbs=1.5)  # ready at 0, waits 3: absorbs all 1.5
    c = dag.add("c", 1.0, ())
    d = dag.add("d", 2.0, ("shard",), (c,), absorbs=1.0)  # ready at 1, waits 3.5 - 1
    e = dag.add("e", 2.0, ("cpu",), absorbs=2.0)  # never waits
    f = dag.add("f", 2.0, ("shard",), (d,), absorbs=1.0)  # ready when the shard frees: no wait
    g = dag.add("g", 1.0, ("cpu",), (c,), absorbs=1.0)  # ready at 1, waits 1 behind e
    s = simulate(dag)
    assert (s.start[b], s.end[b]) == (3.0, 3.5)
    assert (s.start[d], s.end[d]) == (3.5, 4.5)
    assert (s.start[e], s.end[e]) == (0.0, 2.0)
    assert (s.start[f], s.end[f]) == (4.5, 6.5)
    assert (s.start[g], s.end[g]) == (2.0, 2.0)
    with pytest.raises(ValueError, match="absorbs"):
        Dag().add("x", 1.0, (), absorbs=2.0)


def test_a_diamond_waits_for_its_slowest_branch() -> None:
    dag = Dag()
    a = dag.add("a", 1.0, ("x",))
    b = dag.add("b", 4.0, ("y",), (a,))
    c = dag.add("c", 2.0, ("z",), (a,))
    d = dag.add("d", 1.0, ("x",), (b, c))
    s = simulate(dag)
    assert s.end[d] == 6.0 and s.start[c] == 1.0
    assert critical_path(dag, s, d) == [a, b, d]


def test_bad_graphs_are_refused() -> None:
    dag = Dag()
    with pytest.raises(ValueError, match="does not exist"):
        dag.add("a", 1.0, ("x",), (3,))
    with pytest.raises(ValueError, match="negative duration"):
        dag.add("a", -1.0, ("x",))


def _costs(fwd, bwd, nbytes, per_byte=1e-6) -> Costs:
    return Costs(
        fwd=list(fwd),
        bwd=list(bwd),
        layer_bytes=list(nbytes),
        param_tensor_bytes=[[b] for b in nbytes],
        data_s=0.0,
        update_s=0.0,
        wire=Wire(allreduce_s=lambda m: m * per_byte),
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 5.0), st.integers(1, 5_000_000)), min_size=1, max_size=12)
)
def test_wfbp_equals_the_closed_form_recurrence(layers) -> None:
    fwd, bwd, nbytes = zip(*layers, strict=True)
    c = _costs(fwd, bwd, nbytes)
    plan = build_allreduce(c, workers=4, iterations=1, overlap=True, bucket_bytes=0)
    s = simulate(plan.dag)
    n = len(fwd)
    # tau_b(l): backward runs layers L..1 back to back after the forward.
    tau_b, t = {}, sum(fwd)
    for layer in reversed(range(n)):
        tau_b[layer] = t
        t += bwd[layer]
    t_c = [b * 1e-6 for b in nbytes]
    tau_c: dict[int, float] = {}
    for layer in reversed(range(n)):
        after = tau_c[layer + 1] + t_c[layer + 1] if layer + 1 < n else 0.0
        tau_c[layer] = max(after, tau_b[layer] + bwd[layer])
    # Per-layer groups launch in backward order: c0 carries layer L, c1 layer L-1, ...
    starts = {
        n - 1 - int(plan.dag.names[i][1:]): s.start[i] for i in range(len(plan.dag)) if plan.dag.kinds[i] == "allreduce"
    }
    for layer in range(n):
        assert starts[layer] == pytest.approx(tau_c[layer], abs=1e-9)
    assert s.end[plan.iteration_ends["worker0"][0]] == pytest.approx(tau_c[0] + t_c[0], abs=1e-9)


def test_one_flat_allreduce_without_overlap_adds_to_compute() -> None:
    c = _costs([1.0, 1.0], [2.0, 2.0], [1_000_000, 3_000_000])
    c.pack_s, c.unpack_s, c.update_s = 0.5, 0.25, 0.125
    plan = build_allreduce(c, workers=2, iterations=2, overlap=False, bucket_bytes=0)
    s = simulate(plan.dag)
    end0, end1 = (s.end[i] for i in plan.iteration_ends["worker0"])
    assert end0 == pytest.approx(6.0 + 0.5 + 4.0 + 0.25 + 0.125)
    assert end1 - end0 == pytest.approx(end0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40_000_000), min_size=1, max_size=40), st.sampled_from([1, 5, 25]))
def test_bucket_assignment_matches_ddp(sizes, cap_mb) -> None:
    """DDP's own assignment over the same tensors in gradient-ready order."""
    tensors = [torch.empty(max(b // 4, 1)) for b in sizes]
    cap = cap_mb * 1024 * 1024
    torch_buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [cap, cap], [False] * len(tensors))
    ours = ddp_buckets([t.numel() * 4 for t in tensors], cap)
    assert sorted(map(list, torch_buckets)) == sorted(ours)
    first = ddp_buckets([t.numel() * 4 for t in tensors], cap, first_cap_bytes=1024 * 1024)
    torch_first, _ = dist._compute_bucket_assignment_by_size(tensors, [1024 * 1024, cap], [False] * len(tensors))
    assert sorted(map(list, torch_first)) == sorted(first)


@settings(max_examples=200, deadline=None)
@given(
    jobs=st.lists(st.tuples(st.floats(0.01, 3.0), st.integers(1, 4)), min_size=1, max_size=8),
    cores=st.integers(1, 4),
)
def test_cpu_work_started_together_ends_as_processor_sharing_ends_it(jobs, cores) -> None:
    """Jobs of `procs` processes started together on `cores` (each on its own CPU resource):
    the least work ends first, every job progressing at min(1, cores / busy) meanwhile, so
    the k-th to end (by work) ends at sum over j <= k of (w_j - w_{j-1}) * max(1, busy_j / cores),
    busy_j the processes of the jobs not yet ended. Without cores each takes its work's time."""
    dag = Dag()
    tasks = [dag.add(f"compute{k}", work, (f"cpu{k}",), procs=procs) for k, (work, procs) in enumerate(jobs)]
    order = sorted(range(len(jobs)), key=lambda k: jobs[k][0])
    want, now, done = [0.0] * len(jobs), 0.0, 0.0
    for j, k in enumerate(order):
        busy = sum(jobs[i][1] for i in order[j:])
        now += (jobs[k][0] - done) * max(1.0, busy / cores)
        want[k], done = now, jobs[k][0]
    s = simulate(dag, cores)
    for t, end in zip(tasks, want, strict=True):
        assert s.end[t] == pytest.approx(end, rel=1e-6)
        assert s.durations[t] == pytest.approx(s.end[t] - s.start[t], rel=1e-9)
    assert simulate(dag).end == [w for w, _ in jobs]


@settings(max_examples=200, deadline=None)
@given(
    steps=st.integers(1, 6),
    work=st.floats(0.01, 1.0),
    extra=st.floats(0.0, 3.0),
    wait=st.floats(0.0, 2.0),
)
def test_a_chain_beside_a_long_job_shares_one_core_until_the_chain_ends(steps, work, extra, wait) -> None:
    """One core. A wait that is not CPU work, then a chain of `steps` CPU tasks of `work`
    each (each link starting where the one before ended), beside one job of W = wait +
    steps * work + extra started at 0: the job runs alone until the wait ends, then both at
    half speed until the chain ends, at wait + 2 * steps * work, then the job alone for its
    last `extra`."""
    long_work = steps * work + extra + wait  # outlasts the chain: shared the whole time
    dag = Dag()
    job = dag.add("job", long_work, ("cpu1",), procs=1)
    last = dag.add("wait", wait, ("link",))
    chain = []
    for k in range(steps):
        last = dag.add(f"step{k}", work, ("cpu0",), (last,), procs=1)
        chain.append(last)
    s = simulate(dag, cores=1)
    for k, t in enumerate(chain):
        assert s.end[t] == pytest.approx(wait + 2 * (k + 1) * work, rel=1e-6)
    assert s.end[job] == pytest.approx(wait + 2 * steps * work + (long_work - wait - steps * work), rel=1e-6)


def test_workers_that_take_turns_compute_at_full_speed_and_together_share() -> None:
    """Two workers of one process each on one core: where a transfer staggers them by more
    than their compute, each computes alone; where they start together, each takes twice
    its work, and a task that is not CPU work never stretches."""
    for stagger, ends in ((2.0, (1.0, 3.0)), (0.0, (2.0, 2.0))):
        dag = Dag()
        a = dag.add("compute0", 1.0, ("cpu0",), procs=1)
        pull = dag.add("pull", stagger, ("link",))
        b = dag.add("compute1", 1.0, ("cpu1",), (pull,), procs=1)
        after = dag.add("push", 1.0, ("link",), (a,))
        s = simulate(dag, cores=1)
        assert (s.end[a], s.end[b]) == pytest.approx(ends)
        assert s.durations[after] == 1.0
