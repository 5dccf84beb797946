"""Link rates written the way people write them: 10gbit, 100mbit, 125mb, 1.25GB/s.

The one rate parser of ddlbench: the spec's link bandwidths, `ddlbench predict
--bandwidth` and the netns provider's tc rates all read through `parse_rate`.
"""

from __future__ import annotations

import re

# Bytes per second per unit. Bit units (tc's decimal kbit, mbit, ...; and bps, kbps,
# ...) are /8; b, kb, mb, ... and X B/s are bytes. A bare number is bytes per second.
_UNITS = {
    "": 1.0,
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "tbit": 1e12 / 8,
    "bps": 1 / 8,
    "kbps": 1e3 / 8,
    "mbps": 1e6 / 8,
    "gbps": 1e9 / 8,
    "b": 1.0,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "b/s": 1.0,
    "kb/s": 1e3,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "tb/s": 1e12,
}
_RATE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z/]*)\s*")


def parse_rate(text: str) -> float:
    """Bytes per second from '10gbit', '25 Gbit', '125mb', '1.25GB/s' or a bare number of
    bytes/s; ValueError naming the text when it is not a positive rate."""
    m = _RATE.fullmatch(str(text).lower())
    if not m or m.group(2) not in _UNITS or float(m.group(1)) * _UNITS[m.group(2)] <= 0:
        raise ValueError(f"cannot read {text!r}: expected a positive rate such as 10gbit, 100mbit, 125mb or 1.25GB/s")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_bandwidth(text: str) -> float:
    """parse_rate for a `bandwidth` option: its errors name the option."""
    try:
        return parse_rate(text)
    except ValueError as err:
        raise ValueError(f"bandwidth: {err}") from None
