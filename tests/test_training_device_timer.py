"""The device timer (training/measure/device_timer.py) the layer profiler and in-situ sampling share:
the host clock on CPU, CUDA events on CUDA; and a CPU layer profile timed through it."""

from __future__ import annotations

import time

import pytest
import torch

from modelling.measure.profiler import profile_layers
from training.measure.device_timer import CudaEventTimer, HostTimer, timer_for
from training.measure.layer_timing import LayerTimer
from training.models import build_model

NO_CUDA = not torch.cuda.is_available()


def test_on_cpu_the_timer_is_the_host_clock() -> None:
    timer = timer_for(torch.device("cpu"))
    assert isinstance(timer, HostTimer) and not timer.cuda
    before = time.perf_counter()
    start = timer.stamp()
    time.sleep(0.02)
    end = timer.stamp()
    after = time.perf_counter()
    assert isinstance(start, float)
    timer.settle()  # nothing to wait for
    # Between the host clock's readings around it: a fixed upper figure would be wall time a
    # loaded host may exceed, this one moves with it and still fails a wrong unit or clock.
    assert 0.02 <= timer.elapsed(start, end) <= after - before


def test_the_in_situ_sampler_times_through_the_shared_timer() -> None:
    net = build_model("lenet5", (1, 28, 28), 10)
    sampler = LayerTimer(net, torch.device("cpu"), every=1, warmup=0)
    assert isinstance(sampler.timer, HostTimer) and sampler.cuda is False


@pytest.mark.slow
def test_a_cpu_profile_charges_every_layer_in_execution_order() -> None:
    table = profile_layers("lenet5", 8, warmup=1, repeats=3)
    layers = table["layers"]
    assert [layer["type"] for layer in layers] == ["Conv2d", "Conv2d", "Linear", "Linear", "Linear"]
    assert all(layer["fwd_s"] > 0 and layer["bwd_s"] > 0 for layer in layers), layers
    assert table["environment"]["gpu_model"] is None and table["pack_s"] > 0


@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
def test_on_cuda_the_timer_reads_event_pairs_after_one_synchronize() -> None:
    timer = timer_for(torch.device("cuda", 0))
    assert isinstance(timer, CudaEventTimer) and timer.cuda
    x = torch.randn(2048, 2048, device="cuda")
    start = timer.stamp()
    for _ in range(10):
        x = x @ x / 2048
    end = timer.stamp()
    timer.settle()
    assert 0 < timer.elapsed(start, end) < 10


@pytest.mark.slow
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
def test_a_cuda_profile_times_every_layer_with_events() -> None:
    table = profile_layers("lenet5", 8, device="cuda", warmup=1, repeats=3)
    assert table["environment"]["gpu_model"] == torch.cuda.get_device_name(0)
    assert all(layer["fwd_s"] > 0 and layer["bwd_s"] > 0 for layer in table["layers"])


@pytest.mark.parametrize("off_core", [True, False])
def test_a_cpu_layers_cpu_seconds_leave_out_the_time_it_was_off_its_core(off_core: bool) -> None:
    """A wait inside one layer's forward (the rank off its core, as when other work takes it)
    lengthens that layer's wall time and not its CPU seconds; as much work (a spin) lengthens both."""
    from training.inject import spin

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the calling thread's clock holds all of a layer's work
    try:
        net = build_model("lenet5", (1, 28, 28), 10)
        victim = next(m for m in net.modules() if isinstance(m, torch.nn.Linear))
        victim.register_forward_hook(lambda *_: time.sleep(0.03) if off_core else spin(0.03))
        sampler = LayerTimer(net, torch.device("cpu"), every=1, warmup=0)
        assert sampler.cpu_clock
        x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
        for step in range(3):
            sampler.arm(step)
            loss = torch.nn.functional.cross_entropy(net(x), y)
            sampler.backward()
            loss.backward()
            sampler.collect()
        records = [{"step": s, "phases": {"forward": [0.0, 1.0], "backward": [1.0, 2.0]}} for s in range(3)]
        table = sampler.table(records, "lenet5", 4)
    finally:
        torch.set_num_threads(threads)
    assert table is not None
    rows = {r["name"]: r for r in table["layers"]}
    name = next(n for n, m in net.named_modules() if m is victim)
    wall = [s[victim][0] for s in sampler.samples]
    cpu = rows[name]["fwd_cpu_s"]
    assert min(wall) >= 0.03
    if off_core:
        # The wait is in no CPU second: the layer's CPU seconds (the median of the samples) stay an
        # order below it. Not min(wall) - cpu >= wait: that sets one sample's wall against the
        # median's CPU seconds, and the sleep's own system call is CPU time inside its wall time.
        assert cpu < 0.03 / 10, (cpu, wall)
    else:
        assert cpu >= 0.03, (cpu, wall)
    assert all(r["fwd_cpu_s"] >= 0 and r["bwd_cpu_s"] > 0 for r in rows.values()), rows


def test_with_more_intra_op_threads_no_cpu_seconds_are_read() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sampler = LayerTimer(build_model("lenet5", (1, 28, 28), 10), torch.device("cpu"), every=1, warmup=0)
    finally:
        torch.set_num_threads(threads)
    assert not sampler.cpu_clock
