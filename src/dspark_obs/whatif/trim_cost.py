"""The cost of trimming: the run's policy against verifying every draft, on its own traffic.

Trimming makes a step cheaper and gives up the drafts the window cut off. With the
run's tokens/s `C_o / T_o` and static's predicted `C_s / T_s` (`whatif`) over the same
request-steps, the net difference splits exactly into

- **step time saved**: `C_o / T_o - C_o / T_s`, the run's own tokens at its cheaper steps;
- **accepted tokens lost**: `(C_o - C_s) / T_s`, the tokens trimming gave up, at static's
  step time (negative: a loss).

Both sides are the same request-steps, so sampling does not enter the comparison; the
interval is the ceiling estimator's bracket on what static would have accepted where
the run trimmed (what the run itself did is known). A positive net means trimming paid.
"""

from __future__ import annotations

import polars as pl

from ..store import Run
from .predict import whatif

#: Keys of every `trim_cost` entry; documented in docs/whatif.md.
TRIM_COST_KEYS = (
    "level",
    "workload",
    "tokens_per_s",
    "static_tokens_per_s",
    "net_tokens_per_s",
    "net_lo",
    "net_hi",
    "net_share",
    "step_time_saved",
    "accepted_lost",
    "trimmed_tokens_per_request_step",
    "request_steps",
)


def _entry(own: dict, static: dict) -> dict:
    # tokens/s = committed / seconds; recover both from a cell's means and its rate
    c_o = own["mean_committed"] * own["request_steps"]
    c_s = static["mean_committed"] * static["request_steps"]
    c_s_lo = (static["mean_accepted_lo"] + 1) * static["request_steps"]
    c_s_hi = (static["mean_accepted_hi"] + 1) * static["request_steps"]
    t_o, t_s = c_o / own["tokens_per_s"], c_s / static["tokens_per_s"]
    saved = c_o / t_o - c_o / t_s
    lost = (c_o - c_s) / t_s
    net = own["tokens_per_s"] - static["tokens_per_s"]
    return {
        "level": own["level"],
        "workload": own["workload"],
        "tokens_per_s": own["tokens_per_s"],
        "static_tokens_per_s": static["tokens_per_s"],
        "net_tokens_per_s": net,
        "net_lo": own["tokens_per_s"] - c_s_hi / t_s,
        "net_hi": own["tokens_per_s"] - c_s_lo / t_s,
        "net_share": net / static["tokens_per_s"] if static["tokens_per_s"] else None,
        "step_time_saved": saved,
        "accepted_lost": lost,
        "trimmed_tokens_per_request_step": static["mean_accepted"] - own["mean_accepted"],
        "request_steps": own["request_steps"],
    }


def trim_cost_from_cells(cells: list[dict]) -> list[dict]:
    """`trim_cost` from `whatif` cells that hold the `own` and `static` policies on the
    request-steps as recorded (`closed_loop=False`, or `same_steps`), so that a caller
    predicting other policies too (the report) loads the run once."""
    frame = pl.DataFrame(cells).filter(pl.col("policy").is_in(["own", "static"]))
    own = frame.filter(pl.col("policy") == "own").drop("policy")
    static = frame.filter(pl.col("policy") == "static").drop("policy")
    out = []
    for o, s in zip(own.iter_rows(named=True), static.iter_rows(named=True), strict=True):
        if not (o["tokens_per_s"] and s["tokens_per_s"]):
            continue
        out.append(_entry(o, s))
    return out


def trim_cost(run: Run, *, use_shadow: bool = True) -> list[dict]:
    """Per (level, workload), `all` first in each level: the run's policy against static."""
    cells = whatif(
        run, ["own", "static"], use_shadow=use_shadow, closed_loop=False, intervals=False
    )["cells"]
    return trim_cost_from_cells(cells)


def trim_cost_or_why(run: Run) -> tuple[list[dict] | None, str | None]:
    """`trim_cost`, or None and the reason for a run it cannot be predicted for (no
    request-steps, or no cost table and no step times to fit one)."""
    try:
        return trim_cost(run), None
    except ValueError as exc:
        return None, str(exc)


def trim_cost_or_none(run: Run) -> list[dict] | None:
    """`trim_cost`, or None for a run it cannot be predicted for: `summary` still prints
    everything else."""
    return trim_cost_or_why(run)[0]
