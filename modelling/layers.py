"""The layer table (layers.json): reading, checking and writing it.

Kept apart from the profiler so that predicting never imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
    return layers


def load_layers(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise LayersError(f"{path}: no such layer table")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise LayersError(f"{path}: not valid JSON, truncated? ({err.msg} at line {err.lineno})") from None
    return check_layers(data, str(path))


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
