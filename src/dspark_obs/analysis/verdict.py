"""The one-line verdict of a comparison row, and the number formatting it shares with tables.

Wording is fixed so that people and scripts can grep it: "no difference"
(the two runs gave the same numbers, every replicate agreed), "no significant
difference (Holm 95% CI [lo, hi])", or "B higher|lower by X unit (rel%), Holm 95% CI
[lo, hi]" when the Holm-adjusted p-value is below alpha. The interval is the row's
`ci_holm`, at the level Holm tested the row at, so it holds zero exactly when the verdict
says "no significant difference". Rows that could not be compared say "not compared: ..."
with the reason.
"""

from __future__ import annotations

import math
from typing import Any


def _decimals(x: float, sig: int) -> int:
    if x == 0 or not math.isfinite(x):
        return 0
    return max(0, sig - 1 - math.floor(math.log10(abs(x))))


def num(x: float | None, sig: int = 3, *, sign: bool = False) -> str:
    """`x` to about `sig` significant digits, never in scientific notation; '—' for None."""
    if x is None:
        return "—"
    if x == 0:
        return "0"
    return f"{x:{'+' if sign else ''},.{_decimals(x, sig)}f}"


def ci_text(ci: list[float] | tuple[float, float]) -> str:
    """`[lo, hi]`, signed, both ends with the decimals the smaller one needs."""
    lo, hi = ci
    nonzero = [abs(v) for v in (lo, hi) if v != 0]
    d = _decimals(min(nonzero), 2) if nonzero else 0
    return f"[{lo:+,.{d}f}, {hi:+,.{d}f}]" if nonzero else "[0, 0]"


def verdict(row: dict[str, Any], *, confidence: float = 0.95) -> str:
    level = f"Holm {round(100 * confidence)}% CI"
    if row["delta"] is None or row["ci_holm"] is None:
        return f"not compared: {row.get('reason') or 'no finite bootstrap replicate'}"
    delta, ci = row["delta"], row["ci_holm"]
    if delta == 0 and ci[0] == 0 and ci[1] == 0:
        return "no difference"
    if not row["significant"]:
        return f"no significant difference ({level} {ci_text(ci)})"
    unit = f" {row['unit']}" if row["unit"] else ""
    rel = row["rel_delta"]
    rel_text = f" ({100 * rel:+.1f}%)" if rel is not None else ""
    direction = "higher" if delta > 0 else "lower"
    return f"B {direction} by {num(abs(delta))}{unit}{rel_text}, {level} {ci_text(ci)}"
