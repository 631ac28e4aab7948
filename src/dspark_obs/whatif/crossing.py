"""Where two policies' predicted throughput curves cross over the load levels.

A crossing is the batch size at which one policy stops paying against another; between
two adjacent levels whose differences have opposite signs it is interpolated linearly in
log2(batch size), as the report draws load, so the stated batch size is where the drawn
curves meet.

Levels where the two policies are equal are skipped: a scheduler that trims nothing at
batch 1 predicts static's figure there up to a few parts in a million (its step times
priced another way), and a sign taken from that would report a crossing the curves never
make. A sign change across such a stretch of equal levels is a crossing somewhere on it.
"""

from __future__ import annotations

import itertools
import math

#: Relative differences this small are equal throughput: a hundredth of a percent, well
#: inside what any cost table or ceiling can tell apart, and below the report's rounding.
EQUAL = 1e-4


def crossings(levels: list[int], diff: list[float]) -> list[dict]:
    """`{"lo", "hi", "bs"}` for each sign change of `diff` (one policy's tokens/s relative to
    another's, per level), `bs` interpolated between adjacent levels, or the middle (in log2)
    of the equal levels a change passes through."""
    signed = [(i, d) for i, d in enumerate(diff) if abs(d) > EQUAL]
    out = []
    for (i, d0), (j, d1) in itertools.pairwise(signed):
        if (d0 < 0) == (d1 < 0):
            continue
        if j == i + 1:
            x0, x1 = math.log2(levels[i]), math.log2(levels[j])
            x = x0 + d0 / (d0 - d1) * (x1 - x0)
            out.append({"lo": levels[i], "hi": levels[j], "bs": 2**x})
        else:
            lo, hi = levels[i + 1], levels[j - 1]
            mid = (math.log2(lo) + math.log2(hi)) / 2
            out.append({"lo": lo, "hi": hi, "bs": 2**mid})
    return out
