"""The closed loop: a policy's batches hold another mix of requests than the run's.

A real run of another policy commits the same tokens per request in a different number
of steps, so each request's share of a level moves with its committed tokens per
request-step (`closed_loop_weights`), and an SPS budget is split again over batches of
that mix (`recomposed`).
"""

from __future__ import annotations

import numpy as np

from .counterfactual_accept import accepted_under, per_array
from .frame import RunFrame
from .policies import Policy, policy_windows
from .relay import relayed

#: Request-steps at most that an SPS policy's batches are drawn again from (`recomposed`,
#: twice per policy: the two passes cost what one over 1M did).
RECOMPOSED_ROWS = 1 << 19


def closed_loop_weights(frame: RunFrame, committed: np.ndarray) -> np.ndarray:
    """`[pairs]` how much more (or less) of a level's request-steps each request holds under
    the policy than in the run: `c_own / c_policy`, its committed tokens per request-step
    in the run over the policy's (`committed`: its sum per (level, request) pair), scaled so
    that a level keeps its request-steps.

    Fixed concurrency (the reference runtime, a benchmark) or a queue that serves every
    request: a slot, or the server, takes the traffic's requests in turn, and each holds
    its place for its tokens over its committed tokens per request-step. Its tokens do not
    depend on the policy, `c` does, and by how much differs from request to request within
    a workload (a policy that trims harder slows down most the requests whose drafts it
    trims), so the move is per request, not per workload. That holds for the requests a
    level's stretch of steps holds from beginning to end (`CellCodes.pair_inside`); the
    rest (carried in, or cut by the stretch's end) keep their recorded request-steps."""
    c = frame.cells
    n_levels = len(c.levels)
    if frame.own_committed is None:
        frame.own_committed = np.bincount(
            c.pair, frame.inputs.accepted + 1.0, minlength=len(c.pair_rows)
        )
    ratio = frame.own_committed / committed
    moved = c.pair_rows * c.pair_inside
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.bincount(c.pair_level, moved, minlength=n_levels) / np.bincount(
            c.pair_level, moved * ratio, minlength=n_levels
        )
    return np.where(c.pair_inside, ratio * np.nan_to_num(scale)[c.pair_level], 1.0)


def recomposed(frame: RunFrame, policy: Policy, shapes, exact, row_weight, on_recorded) -> tuple:
    """An SPS policy's windows and accepted drafts with its budget split over batches of
    the policy's mix, not the run's.

    The scheduler splits one budget over a batch, so a request's window depends on who
    else is in it. Each step's batch (at most `RECOMPOSED_ROWS` rows, from every k-th step
    beyond) is moved to the policy's mix (`row_weight`, per row, from `closed_loop_weights`)
    by as few changes as it takes: a row of a request the policy holds less of leaves with
    probability `1 - row_weight`, and a row of one it holds more of, from the same level,
    takes its slot. The batches are scheduled again; per cell, the rows' windows and
    accepted drafts over what the same rows had in their recorded batches (`on_recorded`)
    scale the recorded rows. A policy whose mix is the run's changes nothing (the run's own
    SPS replay stays exact), and the ratio over the same rows cancels the draw's sampling
    where the batch does not matter (a batch of one: exactly 1)."""
    c, inp = frame.cells, frame.inputs
    every = -(-len(frame.step) // RECOMPOSED_ROWS)
    steps = np.arange(0, len(frame.step_start), every)
    bs = frame.step_bs[steps]
    rows = np.repeat(frame.step_start[steps] - np.cumsum(np.append(0, bs[:-1])), bs)
    rows += np.arange(len(rows))  # the sampled steps' own rows
    rng = np.random.default_rng(0)
    # a row stays with probability min(1, row_weight); its slot goes to a row of a request
    # the policy holds more of, drawn in proportion to that excess within the level
    leave = rng.random(len(rows)) >= row_weight[rows]
    excess = np.maximum(row_weight - 1.0, 0.0)
    row_level = c.cell[rows] // len(c.workloads)
    for i in range(len(c.levels)):
        free = np.flatnonzero(leave & (row_level == i))
        if len(free) == 0:
            continue
        # the drawn steps' rows of the level: all, up to 0.5M rows
        candidates = rows[row_level == i]
        cdf = np.cumsum(excess[candidates])
        if cdf[-1] <= 0:  # a level has rows leaving only with some excess
            continue
        pick = np.searchsorted(cdf, rng.random(len(free)) * cdf[-1], side="right")
        rows[free] = candidates[np.minimum(pick, len(candidates) - 1)]
    windows = policy_windows(
        policy,
        recorded_window=inp.recorded_window[rows],
        gamma=frame.gamma,
        survival=None if frame.survival is None else frame.survival[rows],
        logits=None if frame.logits is None else frame.logits[rows],
        step_start=np.concatenate(([0], np.cumsum(bs)[:-1])),
        step_bs=bs,
        table=frame.table,
        relayed=relayed(frame, rows),
        last_step=relayed(frame, rows, last_step=True),
    )
    drawn = accepted_under(inp, exact, shapes, windows, rows)
    cell, n = c.cell[rows], len(c.levels) * len(c.workloads)

    def factor(new: np.ndarray, old: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            f = np.bincount(cell, new, minlength=n) / np.bincount(cell, old[rows], minlength=n)
        return np.where(np.isfinite(f), f, 1.0)[c.cell]

    old_windows, old_accepted = on_recorded
    pairs = dict(enumerate(zip(drawn, old_accepted, strict=True)))
    scaled = per_array(lambda da: da[1] * factor(*da), pairs)
    return old_windows * factor(windows, old_windows), tuple(scaled.values())
