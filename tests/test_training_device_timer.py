"""The device timer (training/device_timer.py) the layer profiler and in-situ sampling share:
the host clock on CPU, CUDA events on CUDA; and a CPU layer profile timed through it."""

from __future__ import annotations

import time

import pytest
import torch

from modelling.profiler import profile_layers
from training.device_timer import CudaEventTimer, HostTimer, timer_for
from training.layer_timing import LayerTimer
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
