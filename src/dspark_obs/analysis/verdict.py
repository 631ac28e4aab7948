"""The one-line verdict of a comparison row.

Wording is fixed so that people and scripts can grep it: "no difference"
(the two runs gave the same numbers, every replicate agreed), "no significant
difference (Holm 95% CI [lo, hi])", or "B higher|lower by X unit (rel%), Holm 95% CI
[lo, hi]" when the Holm-adjusted p-value is below alpha. The interval is the row's
`ci_holm`, at the level Holm tested the row at, so it holds zero exactly when the verdict
says "no significant difference". Rows that could not be compared say "not compared: ..."
with the reason.
"""

from __future__ import annotations

from typing import Any

from ..numbers import bracket, number, significant


def verdict(row: dict[str, Any], *, confidence: float = 0.95) -> str:
    level = f"Holm {round(100 * confidence)}% CI"
    if row["delta"] is None or row["ci_holm"] is None:
        return f"not compared: {row.get('reason') or 'no finite bootstrap replicate'}"
    delta, ci = row["delta"], row["ci_holm"]
    if delta == 0 and ci[0] == 0 and ci[1] == 0:
        return "no difference"
    if not row["significant"]:
        return f"no significant difference ({level} {bracket(*ci)})"
    unit = f" {row['unit']}" if row["unit"] else ""
    rel = row["rel_delta"]
    rel_text = f" ({number(100 * rel, 1, signed=True)}%)" if rel is not None else ""
    direction = "higher" if delta > 0 else "lower"
    return f"B {direction} by {significant(abs(delta))}{unit}{rel_text}, {level} {bracket(*ci)}"
