"""The layer table (layers.json): reading, checking and writing it.

Kept apart from the profiler so that predicting never imports torch.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from modelling.measure.files import read_json

LAYER_KEYS = ("name", "type", "fwd_s", "bwd_s", "param_bytes")
TABLE_KEYS = ("model", "batch_size", "layers", "update_s", "data_s")


class LayersError(ValueError):
    """A layer table is missing, truncated or malformed; the message names the file."""


def check_layers(layers: dict[str, Any], source: str = "layers") -> dict[str, Any]:
    if not isinstance(layers, dict):
        raise LayersError(f"{source}: expected a JSON object, got {type(layers).__name__}")
    missing = [k for k in TABLE_KEYS if k not in layers]
    if missing:
        raise LayersError(
            f"{source}: not a ddlbench layer table (lacks {', '.join(missing)}); write one with `ddlbench profile`"
        )
    if not layers["layers"]:
        raise LayersError(f"{source}: the layer table is empty")
    for i, row in enumerate(layers["layers"]):
        lack = [k for k in LAYER_KEYS if k not in row]
        if lack:
            raise LayersError(f"{source}: layers[{i}] lacks {', '.join(lack)}")
        if row["fwd_s"] < 0 or row["bwd_s"] < 0:
            raise LayersError(f"{source}: layers[{i}] ({row['name']}) has a negative time")
    if "memory" in layers:  # the model's memory figures (modelling/memory.py); a table may predate them
        _check_memory(layers["memory"], source)
    return layers


MEMORY_KEYS = ("parameter_bytes", "gradient_bytes", "trainable_numel", "buffer_bytes")


def _check_memory(memory: Any, source: str) -> None:
    act = memory.get("activations") if isinstance(memory, dict) else None
    numbers = [memory.get(k) for k in MEMORY_KEYS] if isinstance(memory, dict) else [None]
    numbers += [act.get(k) for k in ("fixed_bytes", "per_sample_bytes")] if isinstance(act, dict) else [None]
    if not all(isinstance(n, int | float) and not isinstance(n, bool) for n in numbers):
        raise LayersError(f"{source}: memory needs numbers {', '.join(MEMORY_KEYS)} and activations.fixed_bytes, "
                          f"activations.per_sample_bytes; write it with `ddlbench profile`")


def load_layers(path: Path) -> dict[str, Any]:
    return check_layers(read_json(path, "layer table", LayersError), str(path))


def format_table(layers: dict[str, Any]) -> str:
    rows = [
        f"{layers['model']}  batch {layers['batch_size']}  device {layers.get('device', '?')}  "
        f"processes {layers.get('processes', 1)}  input {layers.get('input_shape')}",
        f"{'#':>3} {'layer':<28} {'type':<18} {'fwd ms':>9} {'bwd ms':>9} {'params KB':>10} {'out KB':>9}",
    ]
    for i, r in enumerate(layers["layers"]):
        rows.append(
            f"{i:>3} {r['name'][:28]:<28} {r['type'][:18]:<18} {r['fwd_s'] * 1e3:>9.3f} "
            f"{r['bwd_s'] * 1e3:>9.3f} {r['param_bytes'] / 1024:>10.1f} "
            f"{r.get('output_bytes', 0) / 1024:>9.1f}"
        )
    fwd = sum(r["fwd_s"] for r in layers["layers"])
    bwd = sum(r["bwd_s"] for r in layers["layers"])
    rows.append(
        f"total forward {fwd * 1e3:.3f} ms, backward {bwd * 1e3:.3f} ms, "
        f"update {layers['update_s'] * 1e3:.3f} ms, data {layers['data_s'] * 1e3:.3f} ms"
    )
    return "\n".join(rows) + "\n"


def write_layers(layers: dict[str, Any], out_dir: Path) -> Path:
    """layers.json and a readable layers.txt in out_dir; returns the JSON's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "layers.json"
    path.write_text(json.dumps(layers, indent=2))
    (out_dir / "layers.txt").write_text(format_table(layers))
    return path


_POOLED_SCALARS = ("update_s", "data_s", "pack_s", "unpack_s", "server_update_s", "server_add_s")


def pool_layers(tables: list[dict[str, Any]]) -> dict[str, Any]:
    """One layer table from several profiles of the same model and batch size, taken at
    different times: each time is the median over the profiles, so one profile taken
    while the host was slow (a busy neighbour, CPU steal) does not decide a prediction.
    Whole-iteration samples keep each profile's jitter around its own median (what a
    barrier waits for) but not the drift between profiles, which both workers share."""
    if not tables:
        raise LayersError("layers: nothing to pool")
    first = check_layers(tables[0])
    for i, t in enumerate(tables[1:], 1):
        check_layers(t, f"layers[{i}]")
        same = (t["model"], t["batch_size"], [r["name"] for r in t["layers"]])
        if same != (first["model"], first["batch_size"], [r["name"] for r in first["layers"]]):
            raise LayersError(
                f"layers[{i}]: profiles {t['model']} at batch {t['batch_size']}, not "
                f"{first['model']} at batch {first['batch_size']} with the same layers; only like tables pool"
            )
    pooled = dict(first)
    pooled["layers"] = [
        dict(
            row,
            fwd_s=statistics.median(t["layers"][i]["fwd_s"] for t in tables),
            bwd_s=statistics.median(t["layers"][i]["bwd_s"] for t in tables),
        )
        for i, row in enumerate(first["layers"])
    ]
    for key in _POOLED_SCALARS:
        values = [t[key] for t in tables if key in t]
        if values:
            pooled[key] = statistics.median(values)
    samples = [t.get("iteration_samples_s") or [] for t in tables]
    if all(samples):
        centre = statistics.median(statistics.median(s) for s in samples)
        pooled["iteration_samples_s"] = [x / statistics.median(s) * centre for s in samples for x in s]
    pooled["pooled_profiles"] = len(tables)
    return pooled
