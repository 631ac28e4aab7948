"""The confidence scheduler: one total verify budget per step, split by survival.

Survival S[b, j] (running product of calibrated confidence) is the chance that
request b's draft j and everything before it is accepted, so verifying it is
worth S[b, j] expected tokens. The step's budget K is the number of extra
verify tokens that maximises expected committed tokens per second,
`(bs + sum of the K largest survivals) / T(bs, K)`, and those K slots go to the
highest survivals. Survival never rises along a block, so the chosen slots form
a prefix of every request's block: windows are contiguous by construction (ties
broken towards earlier positions keep that true).

Under SGLang's confidence relay the budget K is planned on older survivals (the
`budget_survival` of the same requests some steps before) while the K slots still go
to the highest survivals of the current block, as SGLang's planner splits the two.

The scaled budget (`budget_scale`) is not SGLang's: it exists so that another budget
rule can be run for real against what `dspark-obs whatif` predicts for it.

vLLM 0.33.0's adaptive verification (`topk_schedule`) is the same objective over the same
cost form, planned differently in time: its budget always comes from the previous step's
confidences, and the slots are admitted by a global top-k of the current ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..domain.cost_table import AdditiveCostTable


@dataclass(frozen=True)
class Schedule:
    windows: np.ndarray  # [bs] drafts to verify per request
    budget: int  # K, extra verify tokens beyond one anchor per request
    predicted_seconds: float  # T(bs, K)
    objective: float  # (bs + sum of chosen survivals) / T(bs, K), tokens/s


def schedule(
    survival: np.ndarray,
    table: AdditiveCostTable,
    budget_survival: np.ndarray | None = None,
    budget_scale: float = 1.0,
) -> Schedule:
    """Windows from `survival`; the budget from `budget_survival` where given, else the same.

    `budget_scale` multiplies the chosen budget (rounded, within 0..bs * gamma): a
    scheduler that verifies more or fewer tokens than its objective asks for, so that
    what-if predictions of such a budget rule can be held to a real run.
    """
    bs, gamma = survival.shape
    if bs == 0:
        return Schedule(np.zeros(0, np.int64), 0, 0.0, 0.0)
    flat = survival.reshape(-1)
    position = np.tile(np.arange(gamma), bs)
    order = np.lexsort((position, -flat))
    ranked = flat[order] if budget_survival is None else np.sort(budget_survival, axis=None)[::-1]
    gains = np.concatenate(([0.0], np.cumsum(ranked)))
    ks = np.arange(len(gains))
    seconds = table.step_seconds(bs, ks)
    objective = (bs + gains) / seconds
    k = int(np.argmax(objective))
    if budget_scale != 1.0:
        k = min(int(np.rint(budget_scale * k)), len(flat))
    windows = np.bincount(order[:k] // gamma, minlength=bs).astype(np.int64)
    return Schedule(windows, k, float(seconds[k]), float(objective[k]))


def topk_schedule(
    survival: np.ndarray, table: AdditiveCostTable, stale_survival: np.ndarray
) -> Schedule:
    """vLLM 0.33.0's admission: the budget from last step's survivals, the slots by this one's.

    `AdaptiveVerificationManager.get_num_tokens` picks the budget K on the host as the
    argmax over K of `(sampling requests + sum of the K largest stale survivals) /
    (draft_cost[bs] + verify_cost[bs + K])`, the stale survivals being the running products
    of the confidences recorded one step before (a request new to its slot: 1);
    `_assign_draft_token_budget` then admits on the device the K slots of highest current
    survival across the batch. With the additive table as the cost (`draft_cost[bs]` its
    bias and per-request part, `verify_cost[m]` its per-token part), every request decoding
    (each one samples) and every draft scheduled, that is `schedule` with the budget planned
    on `stale_survival`; tests/test_vllm_topk.py holds it to vLLM's own two functions.
    """
    return schedule(survival, table, budget_survival=stale_survival)
