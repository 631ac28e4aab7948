"""The confidence relay: which earlier row's survivals a request-step's budget was planned on.

A run whose steps record `lag_steps` planned each budget on the survivals of that many
steps before (SGLang's overlap scheduler); vLLM's `topk` admission plans on the step
before's. A prediction replays the SPS and `topk` policies on those rows, not its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..analysis.request_codes import positions

if TYPE_CHECKING:
    from .frame import RunFrame


def relay_rows(
    step_keys: np.ndarray,
    recorded: np.ndarray,
    step: np.ndarray,
    rid: np.ndarray,
    slot: np.ndarray,
    lags: list[np.ndarray],
) -> list[np.ndarray | None]:
    """Per lag of `lags` (each per step), `[rows]` the row whose survival each
    request-step's budget was planned on under a relay of that lag: the same request's row
    `lag` steps before (`step_keys`: each step's `(rank << 40) + forward_ct`, ascending)
    where it held the same slot (`slot`, its `req_pool_index`; -1 where not recorded) in
    every step since, -1 where it did not (the relay hands a slot that changed hands
    survival 1: a new request, or one back from a retraction, or any request of the rank's
    first steps), and the row itself where a step in between is not among the `recorded`
    keys (every step the run holds, empty ones too: no better guess there). None for a lag
    that no step has.

    The lags share one pass: the sort of the rows and each step distance's look-up serve
    all of them (a run under a relay asked for `topk` reads its own lag and one step)."""
    out: list[np.ndarray | None] = [None] * len(lags)
    wanted = [i for i, lag in enumerate(lags) if (lag > 0).any()]
    if not wanted:
        return out
    n = len(step)
    span = int(rid.max()) + 1
    by_row = np.argsort(step * span + rid, kind="stable")
    sorted_rows = (step * span + rid)[by_row]
    row_lags = {i: lags[i][step] for i in wanted}
    stale = {i: np.zeros(n, bool) for i in wanted}
    unrecorded = {i: np.zeros(n, bool) for i in wanted}
    for i in wanted:
        out[i] = np.arange(n)
    for d in range(1, max(int(lags[i].max()) for i in wanted) + 1):
        before = positions(step_keys, step_keys - d)[step]  # the step d before, -1 if absent
        hit = positions(sorted_rows, np.where(before >= 0, before * span + rid, -1))
        prev = np.where(hit >= 0, by_row[np.maximum(hit, 0)], -1)
        moved = (prev < 0) | ((slot >= 0) & (slot[np.maximum(prev, 0)] != slot))
        # a step before the rank's first (forward_ct < 0) relayed nothing: held, and empty
        none = (step_keys & ((1 << 40) - 1)) < d
        held = ((positions(recorded, step_keys - d) >= 0) | none)[step]
        for i in wanted:
            due = row_lags[i] >= d
            stale[i] |= due & held & moved
            unrecorded[i] |= due & ~held
            at_lag = row_lags[i] == d
            out[i][at_lag] = prev[at_lag]
    for i in wanted:
        out[i][unrecorded[i]] = np.arange(n)[unrecorded[i]]
        out[i][stale[i] & ~unrecorded[i]] = -1
    return out


def relayed(frame: RunFrame, rows: np.ndarray | None = None, *, last_step: bool = False):
    """`(survival, logits)` each row's budget is planned on under the run's confidence relay
    (`relay_row`; rows `rows` of the run, all by default), a row planned on survival 1
    holding 1 (and logits of +inf, 1 under any STS); None without a relay. `last_step`:
    one step back instead (`last_step_row`, the `topk` policy's)."""
    relay = frame.last_step_row if last_step else frame.relay_row
    if relay is None:
        return None
    source = relay if rows is None else relay[rows]
    fresh = (source >= 0)[:, None]
    take = np.maximum(source, 0)

    def gather(m: np.ndarray | None, fill: float):
        return None if m is None else np.where(fresh, m[take], fill)

    return gather(frame.survival, 1.0), gather(frame.logits, np.inf)
