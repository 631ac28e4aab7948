"""What two runs of an A/B have in common, and what the A/B varied.

Comparing runs of different block sizes or different workload sets mixes
apples and oranges (a window of 5 and a window of 7 are not the same
quantity; an overall mean over other workloads is another population), so
`compare` refuses those unless asked; everything else that differs is only
reported, as the list of configuration keys that changed, so the reader sees
what the A/B actually varied.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from ..store import Run


class CompareError(ValueError):
    """Two runs that cannot (or should not) be compared; the CLI prints it on one line."""


def run_gamma(run: Run) -> int | None:
    """The manifest's block size, else the one the steps table records."""
    gamma = run.manifest.get("gamma")
    if gamma is not None:
        return int(gamma)
    found = run.steps().select(pl.col("gamma").drop_nulls().unique()).collect()["gamma"]
    return int(found[0]) if len(found) == 1 else None


def run_workloads(run: Run) -> list[str]:
    """The manifest's workloads in its order, else those the requests table holds."""
    names = run.manifest.get("workloads")
    if names:
        return [str(w) for w in names]
    found = run.requests().select(pl.col("workload").drop_nulls().unique()).collect()
    return sorted(found["workload"].to_list())


def _named(value: Any) -> dict[str, Any] | None:
    """A list of objects that all carry a unique `name`, keyed by it; else None."""
    if not isinstance(value, list) or not all(isinstance(v, dict) and "name" in v for v in value):
        return None
    keyed = {str(v["name"]): v for v in value}
    return keyed if len(keyed) == len(value) else None


def _diff(a: Any, b: Any, key: str, out: list[dict[str, Any]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in [*a, *(k for k in b if k not in a)]:
            _diff(a.get(k), b.get(k), f"{key}.{k}" if key else str(k), out)
        return
    na, nb = _named(a), _named(b)
    if na is not None and nb is not None and (na or nb):
        for name in [*na, *(n for n in nb if n not in na)]:
            _diff(na.get(name), nb.get(name), f"{key}[{name}]", out)
        return
    if json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True):
        out.append({"key": key, "a": a, "b": b})


def config_diff(config_a: dict | None, config_b: dict | None) -> list[dict[str, Any]]:
    """Keys of the two `config` objects whose values differ: `{key, a, b}` each.

    Nested objects become dotted keys and lists of named objects are matched
    by name (`workloads[gsm8k].peak`), so a changed cost-table probe or
    workload preset shows as the one key it is, and a workload only one run
    has shows once, whole; a key missing on one side has `None` there.
    """
    out: list[dict[str, Any]] = []
    _diff(config_a or {}, config_b or {}, "", out)
    return out


def describe(run: Run) -> dict[str, Any]:
    m = run.manifest
    return {
        "run": str(run.path),
        "mode": m.get("mode"),
        "shadow": m.get("shadow"),
        "gamma": run_gamma(run),
        "seed": m.get("seed"),
        "timing": m.get("timing"),
        "workloads": run_workloads(run),
        "complete": run.complete,
    }


def check_comparable(a: dict, b: dict, *, allow_mismatch: bool) -> tuple[list[str], list[str]]:
    """`(common workloads, notes)`; raises CompareError for a gamma or workload-set mismatch."""
    notes: list[str] = []
    problems: list[str] = []
    if a["gamma"] != b["gamma"]:
        problems.append(f"gamma differs (A {a['gamma']}, B {b['gamma']})")
    wa, wb = a["workloads"], b["workloads"]
    if set(wa) != set(wb):
        problems.append(f"workloads differ (A {','.join(wa)}; B {','.join(wb)})")
    if problems and not allow_mismatch:
        raise CompareError(
            "; ".join(problems) + ": refusing to compare (--allow-mismatch compares anyway)"
        )
    notes.extend(f"{p}: compared anyway" for p in problems)
    common = [w for w in wa if w in set(wb)]
    only_a = [w for w in wa if w not in set(wb)]
    only_b = [w for w in wb if w not in set(wa)]
    if only_a or only_b:
        notes.append(
            "dropped workloads not in both runs: "
            + ", ".join([*(f"{w} (A only)" for w in only_a), *(f"{w} (B only)" for w in only_b)])
            + "; 'overall' covers the common ones, step metrics cover all"
        )
    if not common:
        raise CompareError("the runs share no workload: nothing to compare")
    if a["mode"] != b["mode"]:
        notes.append(f"modes differ: {a['mode']} -> {b['mode']}")
    if a["timing"] != b["timing"]:
        ta, tb = (t or "no step times" for t in (a["timing"], b["timing"]))
        notes.append(f"timing differs: {ta} -> {tb}; step times are not alike")
    for name, d in (("A", a), ("B", b)):
        if not d["complete"]:
            notes.append(f"run {name} is not complete (still being written, or its writer died)")
    return common, notes
