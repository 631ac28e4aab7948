"""Verify policies, applied to a recorded run's steps: the windows each would have chosen.

A what-if prediction is only as good as its replay of the policy, so the SPS policies run
the runtime's own rule (`runtime/scheduler.schedule`: the budget K maximising
`(bs + sum of the K largest survivals) / T(bs, K)`, the K slots to the highest
survivals, ties to earlier positions) on the survivals the run recorded; under a
confidence relay (a run whose steps record `lag_steps`, SGLang's default 2) the budget is
planned, as there, on the survivals of the same request `lag_steps` steps before (1 for a
request that was not in its slot then: new, or back from a retraction). It is
vectorised over every step of one batch size at once: one sort and one cumulative sum
per `[steps, bs * gamma]` chunk, the same operations in the same order as the scheduler
applies to one step, so the windows agree with the scheduler's bit for bit.

Policy specs (`dspark-obs whatif --policy`):

- `own`: the windows the run recorded (its own policy, whatever it was);
- `static`: every draft verified (window gamma);
- `window=K`: a fixed window of K drafts per request;
- `sps`: the SPS scheduler with the run's cost table and STS, as SGLang plans;
- `sps:scale=F`: its budget times F (rounded), split by survival as usual;
- `sps:per-request=N`: a fixed budget of N extra tokens per request, split by survival;
- `sps:table=FILE`: planned on another cost table (step costs stay the run's);
- `sps:sts=none|FILE`: planned on the raw confidence, or another STS calibration;
- `topk`: vLLM 0.33.0's adaptive verification (`runtime/scheduler.topk_schedule`): the
  same objective and slots, its budget always planned on each request's survivals of the
  step before (1 for a request that was not in the batch then), whatever the run's relay.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..calibration.sts import apply_sts, load_sts
from ..domain.cost_table import AdditiveCostTable, load_cost_table

#: Entries of a `[steps, bs * gamma]` scheduling chunk (bounds its memory to ~100 MB).
CHUNK_ENTRIES = 1 << 22

SPS_OPTIONS = ("scale", "per-request", "table", "sts")


@dataclass(frozen=True)
class Policy:
    """One verify policy; `spec` is how the user wrote it, and its label in every output."""

    spec: str
    kind: str  # own, static, window, sps, topk
    window: int | None = None
    scale: float = 1.0
    per_request: int | None = None
    table: AdditiveCostTable | None = None
    sts: list[float] | None = None  # None: the run's own confidence; [] none (all 1)


def parse_policy(spec: str, gamma: int) -> Policy:
    """A `Policy` from its spec, or ValueError naming what is wrong; a window may not
    exceed the run's `gamma` (the block has no more drafts to verify)."""
    text = spec.strip()
    if text in ("own", "static", "sps", "topk"):
        return Policy(text, text)
    if text.startswith("window="):
        value = text.partition("=")[2]
        if not value.isdigit():
            raise ValueError(f"policy {spec!r}: window=K needs a whole number of drafts")
        if int(value) > gamma:
            raise ValueError(
                f"policy {spec!r}: the run drafts gamma = {gamma} tokens a block, so a window "
                f"is at most {gamma} (window={gamma} is static)"
            )
        return Policy(text, "window", window=int(value))
    if text.startswith("sps:"):
        name, eq, value = text[4:].partition("=")
        if name not in SPS_OPTIONS or not eq or not value:
            raise ValueError(
                f"policy {spec!r}: sps takes one of {', '.join(o + '=...' for o in SPS_OPTIONS)}"
            )
        if name == "scale":
            try:
                scale = float(value)
            except ValueError:
                scale = float("nan")
            if not (np.isfinite(scale) and scale >= 0):
                raise ValueError(f"policy {spec!r}: scale must be a number >= 0")
            return Policy(text, "sps", scale=scale)
        if name == "per-request":
            if not value.isdigit():
                raise ValueError(f"policy {spec!r}: per-request needs a whole number of tokens")
            return Policy(text, "sps", per_request=int(value))
        if name == "table":
            return Policy(text, "sps", table=load_cost_table(Path(value)))
        temps = [] if value == "none" else list(load_sts(Path(value)).temperatures)
        return Policy(text, "sps", sts=temps)
    raise ValueError(
        f"unknown policy {spec!r}: give own, static, window=K, sps, sps:OPTION=VALUE or topk"
    )


def policy_survival(policy: Policy, survival: np.ndarray, logits: np.ndarray | None) -> np.ndarray:
    """The survivals the policy plans on: the recorded ones, or the raw logits re-calibrated."""
    if policy.sts is None:
        return survival
    if logits is None or np.isnan(logits).all():
        raise ValueError(f"policy {policy.spec}: the run recorded no confidence logits")
    gamma = logits.shape[1]
    temps = policy.sts or [1.0] * gamma
    if len(temps) != gamma:
        raise ValueError(f"policy {policy.spec}: STS has {len(temps)} temperatures, gamma {gamma}")
    return apply_sts(logits, temps)[1]


def sps_windows(
    survival: np.ndarray,
    step_start: np.ndarray,
    step_bs: np.ndarray,
    table: AdditiveCostTable,
    rules: list[tuple[float, int | None]],
    budget_survival: np.ndarray | None = None,
) -> list[np.ndarray]:
    """`[rows]` windows of the SPS scheduler over every step (rows grouped by step), one
    array per budget rule `(scale, per_request)` of `rules`; the budget is planned on
    `budget_survival` where given (the relayed survivals), the slots go by `survival`.

    `survival` is `[rows, gamma]` with each step's rows contiguous from `step_start`;
    a step's budget is the argmax of the scheduler's objective (times `scale`), or
    `per_request * bs` where given. The budget's K slots are the K largest survivals,
    ties to earlier positions, then to earlier requests: every slot above the K-th
    largest value, and the first of those equal to it in (position, request) order. Only
    the values are sorted (the objective needs them in order, not where they came from),
    which is several times cheaper than the scheduler's argsort and picks the same slots;
    the rules share that sort and the objective, so that several budgets on the same
    survivals cost little more than one.
    """
    rows, gamma = survival.shape
    out = [np.zeros(rows, np.int64) for _ in rules]
    for bs in np.unique(step_bs[step_bs > 0]).tolist():
        starts = step_start[step_bs == bs]
        width = bs * gamma
        seconds = table.step_seconds(bs, np.arange(width + 1))
        chunk = max(1, CHUNK_ENTRIES // width)
        for lo in range(0, len(starts), chunk):
            idx = starts[lo : lo + chunk, None] + np.arange(bs)[None, :]
            block = survival[idx]  # [n, bs, gamma]
            n = len(idx)
            ranked = np.sort(block.reshape(n, width), axis=1)[:, ::-1]  # decreasing
            best = None
            for windows, (scale, per_request) in zip(out, rules, strict=True):
                if per_request is not None:
                    k = np.full(n, min(per_request * bs, width))
                else:
                    if best is None:
                        planned = ranked
                        if budget_survival is not None:
                            flat = budget_survival[idx].reshape(n, width)
                            planned = np.sort(flat, axis=1)[:, ::-1]
                        gains = np.zeros((n, width + 1))
                        np.cumsum(planned, axis=1, out=gains[:, 1:])
                        gains += bs
                        gains /= seconds
                        best = np.argmax(gains, axis=1)
                    k = best
                    if scale != 1.0:
                        k = np.minimum(np.rint(scale * k).astype(np.int64), width)
                windows[idx.ravel()] = _top_k_windows(block, ranked, k).ravel()
    return out


def _top_k_windows(block: np.ndarray, ranked: np.ndarray, k: np.ndarray) -> np.ndarray:
    """`[n, bs]` slots per request among each step's `k` largest of `block` `[n, bs, gamma]`
    (`ranked`: each step's values in decreasing order), ties to earlier positions, then
    earlier requests (the scheduler's order)."""
    n = len(block)
    v = np.take_along_axis(ranked, np.maximum(k - 1, 0)[:, None], axis=1)[:, :, None]
    above = block > v
    equal = block == v
    need = k - above.reshape(n, -1).sum(axis=1)
    chosen = above | equal
    # where a step holds more values equal to its K-th than it takes, the first ones in
    # (position, request) order; mostly none does (one value is the K-th), so only those
    split = np.flatnonzero(equal.reshape(n, -1).sum(axis=1) > need)
    if len(split):
        tied = equal[split].transpose(0, 2, 1)  # [m, gamma, bs]: position-major order
        order = np.cumsum(tied.reshape(len(split), -1), axis=1).reshape(tied.shape)
        taken = tied & (order <= need[split, None, None])
        chosen[split] = above[split] | taken.transpose(0, 2, 1)
    chosen &= (k > 0)[:, None, None]
    # the count over the short last axis as a product: a third of a bool sum's time
    return chosen.view(np.uint8) @ np.ones(block.shape[2], np.uint8)


def policy_windows(policy: Policy, **kwargs) -> np.ndarray:
    """`[rows]` drafts the policy verifies per request-step of the run (`policies_windows`)."""
    return policies_windows([policy], **kwargs)[0]


def policies_windows(
    policies: list[Policy],
    *,
    recorded_window: np.ndarray,
    gamma: int,
    survival: np.ndarray | None,
    logits: np.ndarray | None,
    step_start: np.ndarray,
    step_bs: np.ndarray,
    table: AdditiveCostTable,
    relayed: tuple[np.ndarray | None, np.ndarray | None] | None = None,
    last_step: tuple[np.ndarray | None, np.ndarray | None] | None = None,
) -> list[np.ndarray]:
    """`[rows]` drafts each policy verifies per request-step of the run; SPS policies
    that plan on the same survivals and table (differing in their budget rule) are
    scheduled together (`sps_windows`). `relayed`: the (survival, logits) rows each
    request-step's budget is planned on under a confidence relay (`relay.relayed`),
    None without one; `last_step`: the same one step back, which `topk` plans on."""
    out: list[np.ndarray | None] = [None] * len(policies)
    planned: dict = {}
    for i, policy in enumerate(policies):
        if policy.kind == "own":
            out[i] = recorded_window
        elif policy.kind == "static":
            out[i] = np.full(len(recorded_window), gamma, np.int64)
        elif policy.kind == "window":
            out[i] = np.full(len(recorded_window), min(policy.window, gamma), np.int64)
        else:
            if survival is None or np.isnan(survival).any():
                raise ValueError(
                    f"policy {policy.spec}: the SPS scheduler needs every request-step's "
                    "survival (confidence), which this run does not record for all of them"
                )
            if policy.kind == "topk" and last_step is None:
                raise ValueError(
                    "policy topk: its budget is planned on the step before's survivals, "
                    "which were not read for this prediction"
                )
            sts = None if policy.sts is None else tuple(policy.sts)
            planned.setdefault((policy.kind, sts, id(policy.table)), []).append(i)
    for (kind, _, _), members in planned.items():
        first = policies[members[0]]
        budget = last_step if kind == "topk" else relayed
        rules = [(policies[i].scale, policies[i].per_request) for i in members]
        windows = sps_windows(
            policy_survival(first, survival, logits),
            step_start,
            step_bs,
            first.table or table,
            rules,
            None if budget is None else policy_survival(first, *budget),
        )
        for i, w in zip(members, windows, strict=True):
            out[i] = w
    return out
