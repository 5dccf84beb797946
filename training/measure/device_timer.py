"""Stamps that time work on a device: the host clock on CPU, CUDA events on CUDA.

A CUDA call returns before its kernel runs, so a host clock read after it times the launch,
not the work; synchronising before every read would time the work but stall the stream at
every stamp. An event recorded on the current stream is stamped when the stream reaches it,
so an iteration records its events, synchronises once at its end (`settle`), and only then
reads them (`elapsed`). The layer profiler (modelling/measure/profiler.py) and the in-situ sampling
(training/measure/layer_timing.py) time layers through it.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch


class DeviceTimer(Protocol):
    """Stamp during an iteration; settle once after it; then read the spans."""

    cuda: bool

    def stamp(self) -> Any: ...

    def settle(self) -> None: ...

    def elapsed(self, start: Any, end: Any) -> float: ...


class HostTimer:
    """The host's perf_counter: on CPU the work is done when the call returns."""

    cuda = False

    def stamp(self) -> float:
        return time.perf_counter()

    def settle(self) -> None:
        return None

    def elapsed(self, start: float, end: float) -> float:
        return end - start


class CudaEventTimer:
    """CUDA event pairs on the current stream of `device`, read after one synchronize."""

    cuda = True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def stamp(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def settle(self) -> None:
        torch.cuda.synchronize(self.device)

    def elapsed(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds


def timer_for(device: torch.device) -> DeviceTimer:
    """The timer of work on `device`: CUDA events on a GPU, the host clock anywhere else."""
    return CudaEventTimer(device) if device.type == "cuda" else HostTimer()
