"""Measuring the machine: the layer profile (`profiler`, run per rank by `profile_rank`) and the
communication microbenchmarks (`microbench`, run per rank by `microbench_rank`, with the clock's
offsets in `microbench_clock` and the device's in `microbench_device`), their settings
(`configs`) and their records on disk (`layers`, `records`, `files`). What modelling/ fits and
predicts from; it may import training and infra, and modelling's fit for the records it reads
back."""
