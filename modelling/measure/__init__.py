"""Measuring the machine: the layer profile (`profiler`, run per rank by `profile_rank`) and the
communication microbenchmarks (`microbench`, run per rank by `microbench_rank`, with the clock's
offsets in `microbench_clock` and the device's in `microbench_device`), their settings
(`configs`), their records on disk (`layers`, `records`, `files`) and what the placement's
links and the kernel's sockets are (`links`). What modelling/ fits and predicts from; it may
import training and infra, nothing of modelling/network/ (a contract in pyproject.toml)."""
