"""Prometheus-style durations (`15s`, `30m`, `1h30m`, `7d`), as the dashboards' ranges and
the store's time ranges take them."""

from __future__ import annotations

import re

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration such as `15s`, `15m`, `1h30m`."""
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not text or pos != len(text) or total <= 0:
        raise ValueError(f"not a duration: {text!r} (e.g. 15s, 15m, 1h)")
    return total
