"""Where two policies' predicted throughput curves cross over the load levels.

A crossing is the batch size at which one policy stops paying against another; between
two adjacent levels whose differences have opposite signs it is interpolated linearly in
log2(batch size), as the report draws load, so the stated batch size is where the drawn
curves meet.
"""

from __future__ import annotations

import math


def crossings(levels: list[int], diff: list[float]) -> list[dict]:
    """`{"lo", "hi", "bs"}` for each strict sign change of `diff` (one policy's tokens/s
    relative to another's, per level) between adjacent levels, `bs` interpolated; a level
    where the two are exactly equal is not counted."""
    out = []
    for i in range(len(levels) - 1):
        d0, d1 = diff[i], diff[i + 1]
        if not (d0 < 0 < d1 or d1 < 0 < d0):
            continue
        x0, x1 = math.log2(levels[i]), math.log2(levels[i + 1])
        x = x0 + d0 / (d0 - d1) * (x1 - x0)
        out.append({"lo": levels[i], "hi": levels[i + 1], "bs": 2**x})
    return out
