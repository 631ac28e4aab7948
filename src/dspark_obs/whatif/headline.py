"""The cost of trimming in one line: what `report` and `compare` put above their tables.

The whole-batch entries of `trim_cost`, level by level, so a reader sees at a glance where
trimming paid and where it cost; the split into step time saved and accepted tokens lost
is in the tables beside it.
"""

from __future__ import annotations

from ..numbers import delta, interval, percent


def level_headline(e: dict) -> str:
    """One level's net against static, its share and its interval."""
    share = "" if e["net_share"] is None else f" ({percent(e['net_share'], signed=True)})"
    return (
        f"bs {e['level']:,}: {delta(e['net_tokens_per_s'], 1)} tokens/s{share} "
        f"(interval {interval(e['net_lo'], e['net_hi'], 1, signed=True)})"
    )


def trim_headline(entries: list[dict]) -> str:
    """Net tokens/s of the run's policy against static at every level, whole batches."""
    whole = [e for e in entries if e["workload"] == "all"]
    if not whole:
        return "no level with timed steps to compare"
    return "; ".join(level_headline(e) for e in whole)


def trimmed_by_workload(entries: list[dict]) -> dict[str, float]:
    """Trimmed drafts per request-step over all levels, per workload (`all`: every one):
    each level's mean weighted by its request-steps."""
    sums: dict[str, list[float]] = {}
    for e in entries:
        acc = sums.setdefault(e["workload"], [0.0, 0.0])
        acc[0] += e["trimmed_tokens_per_request_step"] * e["request_steps"]
        acc[1] += e["request_steps"]
    return {name: total / n for name, (total, n) in sums.items() if n}
