"""Link rates written the way people write them: 10gbit, 100mbit, 1.25GB/s."""

from __future__ import annotations

import re

_UNITS = {
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "tbit": 1e12 / 8,
    "b/s": 1.0,
    "kb/s": 1e3,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "tb/s": 1e12,
    "bps": 1 / 8,
    "kbps": 1e3 / 8,
    "mbps": 1e6 / 8,
    "gbps": 1e9 / 8,
}


def parse_bandwidth(text: str) -> float:
    """Bytes per second from '10gbit', '25 Gbit', '1.25GB/s' or a bare number of bytes/s."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z/]*)\s*", text.lower())
    if not m or m.group(2) not in _UNITS and m.group(2):
        raise ValueError(f"bandwidth: cannot read {text!r}; write e.g. 10gbit, 100mbit or 1.25GB/s")
    value = float(m.group(1)) * (_UNITS[m.group(2)] if m.group(2) else 1.0)
    if value <= 0:
        raise ValueError(f"bandwidth: must be positive, got {text!r}")
    return value
