"""JSON output that strict parsers accept: NaN and infinities become null, numpy becomes Python."""

from __future__ import annotations

import json

import numpy as np


def clean_json(obj):
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_json(v) for v in obj]
    return obj


def dumps(obj, **kwargs) -> str:
    """`obj` as JSON any parser accepts: `clean_json` first, and a ValueError, not an
    `Infinity`, for anything it missed (`allow_nan=False`)."""
    return json.dumps(clean_json(obj), allow_nan=False, **kwargs)
