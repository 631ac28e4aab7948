"""What another verify policy would have given on a recorded run's traffic.

One run holds both sides of the trade the compact scheduler makes: fewer verify tokens
make a step cheaper (the cost table), and trimming gives up accepted tokens (the
ceiling). For each policy (`policies.py`) and each request-step of the run, the window
the policy would have chosen on the recorded confidences and batch; the drafts that
window accepts (`counterfactual_accept.py`: what happened within the recorded window,
the ceiling estimator beyond it); and the step's time at the policy's packed verify
tokens (`step_times.py`), rounded up to the captured tier as the runtime and SGLang do. A
measured step time is scaled by the table's ratio between the policy's tokens and the recorded
ones, so the run's own policy reproduces its measured times and its noise stays in every
prediction; an untimed step takes the table's time.

The prediction holds the traffic and the token streams fixed. A real run of another
policy commits the same tokens per request (DSpark's verification is lossless) but in a
different number of steps, so its batches hold another mix: each workload's share of a
level moves with its committed tokens per request-step (`closed_loop.py`), and an SPS
budget is split again over batches of that mix. Which requests a real run's level holds
beyond that is sampling, the interval's sampling part. What it does not cover is a
policy that changes the load itself (an open-loop server whose queue grows when steps
slow down).

Cells are (load level, workload) and (load level, `all`): a level is the batch size
(`load.load_level`), tokens/s a cell's committed tokens over its request-steps' share
of step time (`T / bs` each; for `all` exactly the level's throughput) and per-request
tokens/s committed tokens over the step time its requests sat through (`figures.py`,
their intervals `intervals.py`).

The run is read once into arrays (`frame_loader.py`: its rows, their cells as integer
codes `cell_codes.py`, their walks `walk_columns.py`, the rows a relay planned on
`relay.py`); this module runs each policy over them and assembles the report.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..store import Run
from .closed_loop import closed_loop_weights, recomposed
from .counterfactual_accept import accepted_under, exact_ceiling, tail_shapes
from .figures import cell_figures, recorded_rates
from .frame import RunFrame
from .frame_loader import load_run_frame
from .policies import Policy, parse_policy, policies_windows
from .relay import relayed
from .step_times import step_seconds, step_tokens

#: Policies `whatif` predicts when none are named.
DEFAULT_POLICIES = ("own", "static", "sps", "window=3", "sps:scale=0.5")

#: Keys of every cell; documented in docs/whatif.md.
CELL_KEYS = (
    "policy",
    "level",
    "workload",
    "steps",
    "request_steps",
    "mean_window",
    "verify_tokens_per_step",
    "mean_accepted",
    "mean_accepted_lo",
    "mean_accepted_hi",
    "mean_committed",
    "step_ms",
    "tokens_per_s",
    "tokens_per_s_lo",
    "tokens_per_s_hi",
    "per_request_tokens_per_s",
    "per_request_tokens_per_s_lo",
    "per_request_tokens_per_s_hi",
)


def frame_windows(frame: RunFrame, policies: list[Policy]) -> list[np.ndarray]:
    """`policies_windows` on the run's request-steps."""
    return policies_windows(
        policies,
        recorded_window=frame.inputs.recorded_window,
        gamma=frame.gamma,
        survival=frame.survival,
        logits=frame.logits,
        step_start=frame.step_start,
        step_bs=frame.step_bs,
        table=frame.table,
        relayed=relayed(frame),
        last_step=relayed(frame, last_step=True),
    )


def _planned_together(frame: RunFrame, policies: list[Policy]) -> dict:
    """The windows of the SPS policies, by spec, scheduled together (one sort of each
    step's survivals for all of them); empty where one of them cannot be scheduled, so
    that each policy says why on its own."""
    sps = [p for p in policies if p.kind == "sps"]
    if len(sps) < 2:
        return {}
    try:
        return {p.spec: w for p, w in zip(sps, frame_windows(frame, sps), strict=True)}
    except ValueError:
        return {}


def predict_policy(
    frame: RunFrame,
    policy: Policy,
    shapes,
    exact,
    *,
    closed_loop: bool = True,
    windows: np.ndarray | None = None,
) -> list[dict]:
    """The cells of one policy, sorted by level then workload (`all` first).

    `closed_loop` (any policy but `own`) moves each level's mix of workloads to the one the
    policy's speeds give (`closed_loop_weights`); without it the cells are on the
    request-steps as recorded, the cost of trimming's definition. `windows`: the policy's
    on the run's request-steps where already scheduled (`_planned_together`)."""
    inp = frame.inputs
    if windows is None:
        windows = frame_windows(frame, [policy])[0]
    accepted = accepted_under(inp, exact, shapes, windows)
    c = frame.cells
    pair_weight = row_weight = None
    on_recorded = (windows, accepted)  # the policy on the batches as recorded
    if closed_loop and policy.kind != "own":
        committed = np.bincount(c.pair, accepted[0] + 1.0, minlength=len(c.pair_rows))
        pair_weight = closed_loop_weights(frame, committed)
        row_weight = pair_weight[c.pair]
        if policy.kind in ("sps", "topk"):
            windows, accepted = recomposed(frame, policy, shapes, exact, row_weight, on_recorded)
            # the mix and the budget split over it move together: the mix again from what
            # the recomposed batches commit, and the batches again over that mix
            committed = np.bincount(c.pair, accepted[0] + 1.0, minlength=len(c.pair_rows))
            pair_weight = closed_loop_weights(frame, committed)
            row_weight = pair_weight[c.pair]
            windows, accepted = recomposed(frame, policy, shapes, exact, row_weight, on_recorded)
    tokens = step_tokens(frame, windows, row_weight)
    seconds = step_seconds(frame, tokens)
    n_levels, n_wl = len(c.levels), len(c.workloads)
    per_wl, whole = cell_figures(frame, windows, accepted, seconds, pair_weight)
    if pair_weight is not None:
        # the correction rests on the steady state of a level that its first requests (the
        # previous level's) have left, and on batches drawn at random: half its size is
        # taken as its uncertainty, on both sides
        cell_committed = np.bincount(c.cell, on_recorded[1][0] + 1.0, minlength=len(c.cell_rows))
        recorded_seconds = step_seconds(frame, step_tokens(frame, on_recorded[0]))
        recorded = recorded_rates(frame, cell_committed, recorded_seconds)
        for fig, rates in zip((per_wl, whole), recorded, strict=True):
            for key, value in rates.items():
                half = 0.5 * np.abs(fig[key] - value)
                fig[f"{key}_lo"] = fig[f"{key}_lo"] - half
                fig[f"{key}_hi"] = fig[f"{key}_hi"] + half
    # whole batches: per level, the mean step time and packed verify tokens per step
    level_sum = lambda v: np.bincount(c.step_level, v, minlength=n_levels)  # noqa: E731
    whole["step_ms"] = level_sum(seconds) / c.level_steps * 1e3
    whole["verify_tokens_per_step"] = level_sum(tokens) / c.level_steps
    with np.errstate(divide="ignore", invalid="ignore"):
        per_wl["verify_tokens_per_step"] = per_wl["tokens"] / c.cell_steps
    out = []
    for i, level in enumerate(c.levels.tolist()):
        ids = [(whole, i, "all", c.level_steps[i])]
        named = sorted((w, k) for k, w in enumerate(c.workloads) if w is not None)
        unnamed = [(None, k) for k, w in enumerate(c.workloads) if w is None]
        for w, k in named + unnamed:
            ids.append((per_wl, i * n_wl + k, w, c.cell_steps[i * n_wl + k]))
        for fig, j, workload, steps in ids:
            if fig["request_steps"][j] == 0:
                continue
            cell = {"policy": policy.spec, "level": level, "workload": workload,
                    "steps": int(steps), "request_steps": int(fig["request_steps"][j])}  # fmt: skip
            for key in CELL_KEYS[5:]:
                if key in fig:  # a rate's interval only where the frame has clusters
                    cell[key] = float(fig[key][j])
            out.append(cell)
    return out


def whatif(
    run: Run,
    policies: list[str] | None = None,
    *,
    use_shadow: bool = True,
    skip_unavailable: bool = False,
    closed_loop: bool = True,
    same_steps: tuple[str, ...] = (),
    intervals: bool = True,
) -> dict:
    """The `dspark-obs whatif --json` object: every policy's cells on the run's traffic.

    `skip_unavailable` leaves out a policy the run cannot support (an SPS policy without
    survivals or logits) and names it with the reason under `unavailable`, so that the
    report draws what it can; without it such a policy is refused. `closed_loop=False`
    predicts on the request-steps as recorded (`predict_policy`); `same_steps` names
    policies (of `policies`) predicted that way too, under `same_steps_cells`.
    `intervals=False` (with `closed_loop=False` only) leaves the rates' intervals out of
    the cells (their `_lo` and `_hi` keys) and loads the run without what only they
    read (`load_run_frame`'s `clusters`): the cost of trimming reads the points and the
    accepted drafts' bracket alone.
    """
    if not intervals and closed_loop:
        raise ValueError("the closed loop moves requests: it needs the run's intervals' clusters")
    gamma = run.gamma
    defaults = [p for p in DEFAULT_POLICIES if not p.startswith("window=") or int(p[7:]) < gamma]
    parsed = [parse_policy(p, gamma) for p in (policies or defaults)]
    frame = load_run_frame(run, use_shadow=use_shadow, policies=parsed, clusters=intervals)
    inp = frame.inputs
    exact = exact_ceiling(inp)
    shapes = tail_shapes(inp, exact, int(inp.group.max()) + 1)
    # the predictions read the ceilings from `exact` and `shapes` alone: the columns they
    # came from go (330 MB on 10M request-steps, 890 MB with the confidences)
    dropped = ("known_ceiling", "confidence", "walk_exact", "walk_lo", "walk_point", "walk_hi")
    frame.inputs = inp = dataclasses.replace(inp, **dict.fromkeys(dropped))
    cells, unavailable, same_steps_cells = [], {}, []
    planned = None  # at the first SPS policy, so that the others run without its windows
    for policy in parsed:
        if planned is None and policy.kind == "sps":
            planned = _planned_together(frame, parsed)
        windows = (planned or {}).pop(policy.spec, None)
        try:
            cells += predict_policy(
                frame, policy, shapes, exact, closed_loop=closed_loop, windows=windows
            )
            if closed_loop and policy.spec in same_steps:
                same_steps_cells += predict_policy(
                    frame, policy, shapes, exact, closed_loop=False, windows=windows
                )
        except ValueError as exc:
            if not skip_unavailable:
                raise
            unavailable[policy.spec] = str(exc)
    out = {
        "run": str(run.path),
        "mode": run.manifest.get("mode"),
        "gamma": frame.gamma,
        "cost_table": frame.table_source,
        "request_steps": len(inp.recorded_window),
        "unknown_ceilings": len(shapes.rows),
        "ceiling_sources": frame.ceiling_sources,
        "cells": cells,
    }
    if skip_unavailable:
        out["unavailable"] = unavailable
    if same_steps:
        out["same_steps_cells"] = same_steps_cells
    return out
