"""What a training run measures of itself: its per-iteration timeline (`timeline`), per-layer
compute in situ (`layer_timing`, through `device_timer`), memory per rank (`memory`), the
host-speed canary (`canary`), the device's peak FLOPs (`peak`) and the summary they make
(`summary`). The trainer and the rank entry point use it; modelling and pipelines read what it
writes. It imports training's config and nothing above training."""
