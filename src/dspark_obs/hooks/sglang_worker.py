"""dspark-obs inside an SGLang DSpark worker: every verify step, in band, no HTTP polling.

SGLang's DSpark worker reports each verify step to its observers
(`DsparkStepObservers.observe_verify_step`) with the tensors the step produced:
drafts, the draft's corrected logits, the target's verify logits, acceptance
counts. `attach(worker)` wraps that call: after SGLang's own observers run,
the step becomes a StepBatch (log-probabilities gathered from those very
logits), and the ceiling estimator can gather the target's log-probability of
trimmed tail tokens while the step's logits still exist. The pipeline serves
`/metrics` from inside the worker process.

sglang is never imported here: the hook checks the observer's keyword
signature against the one it was written for (SGLang 0.5.23) and, where it
differs, does nothing and warns once. A failure inside the hook is counted and
logged once; it never reaches the serving path.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from typing import Any

import numpy as np

from ..pipeline import Pipeline, build_pipeline
from ..telemetry import StepBatch

log = logging.getLogger(__name__)

#: Keyword parameters of SGLang 0.5.23's `DsparkStepObservers.observe_verify_step`.
OBSERVER_PARAMETERS = frozenset(
    {
        "forward_ct",
        "reqs",
        "bs",
        "proposal_folded",
        "verify_ids_2d",
        "target_logits",
        "layout",
        "confidence",
        "confidence_raw",
        "prefix_lens",
        "draft_tokens",
        "draft_block",
        "sampling_info",
        "correct_len",
        "cap_trim_lens",
        "bonus",
        "commit_lens",
        "verify_token_budget",
        "req_pool_indices",
        "verify_tier_num_tokens",
        "dp_tier_num_tokens",
    }
)
SOURCE = "sglang-hook"


def _np(t) -> np.ndarray:
    return t.detach().to("cpu").numpy()


class StepAdapter:
    """Turns one `observe_verify_step` call into a StepBatch and a log-probability gather."""

    def __init__(self, gamma: int, mode: str, rank: int = 0) -> None:
        self.gamma, self.mode, self.rank = gamma, mode, rank

    def token_logprobs(self, logits, rows, tokens, temps):
        """log softmax(logits[rows] / temps)[tokens] in float32, each logit row read once.

        A fused Triton kernel on CUDA, a chunked torch form elsewhere: no [K, V]
        float32 copy of the verify logits (see dspark_obs.kernels.token_logprobs).
        """
        from ..kernels.token_logprobs import token_logprobs

        return token_logprobs(logits, rows, tokens, temps)

    def batch(self, kw: dict[str, Any]):
        import torch

        g = self.gamma
        draft = kw["draft_tokens"]
        bs = int(kw["bs"])
        device = draft.device
        rows_per_req = g + 1
        cl = kw["correct_len"].to(torch.int64)
        layout = kw["layout"]
        verify_len = (
            layout.verify_lens.to(torch.int64)
            if layout is not None
            else torch.full((bs,), rows_per_req, dtype=torch.int64, device=device)
        )
        block = kw["draft_block"]
        info = kw["sampling_info"]
        temps = (info.temperatures if info is not None else block.temperatures).reshape(bs)
        temps = temps.to(torch.float32)
        greedy = block.greedy_mask.reshape(bs).to(torch.bool)
        target = kw["target_logits"]
        b = torch.arange(bs, device=device)
        j = torch.arange(g, device=device)
        flat_rows = (b[:, None] * rows_per_req + j[None, :]).reshape(-1)
        flat_draft = draft.reshape(-1).to(torch.int64)
        rep_t = temps.repeat_interleave(g)
        target_lp = self.token_logprobs(target, flat_rows, flat_draft, rep_t).reshape(bs, g)
        verified = j[None, :] < (verify_len - 1)[:, None]
        target_lp = torch.where(verified, target_lp, torch.full_like(target_lp, float("nan")))
        draft_lp = self.token_logprobs(
            block.corrected_logits.reshape(bs * g, -1),
            torch.arange(bs * g, device=device),
            flat_draft,
            block.temperatures.reshape(bs).to(torch.float32).repeat_interleave(g),
        ).reshape(bs, g)
        bonus = kw["bonus"].to(torch.int64)
        bonus_lp = self.token_logprobs(target, b * rows_per_req + cl, bonus, temps)
        conf = kw["confidence"]
        raw = kw["confidence_raw"]
        greedy_np = _np(greedy).astype(np.int8)
        batch = StepBatch(
            forward_ct=int(kw["forward_ct"]),
            gamma=g,
            mode=self.mode,
            rank=self.rank,
            bs=bs,
            budget=None if kw["verify_token_budget"] is None else int(kw["verify_token_budget"]),
            num_running_reqs=bs,
            num_verify_tokens=int(kw["verify_tier_num_tokens"]),
            verify_tokens_local=int(kw["verify_tier_num_tokens"]),
            verify_tokens_graph_key=int(kw["verify_tier_num_tokens"]),
            rid=np.array([r.rid for r in kw["reqs"]] + [None], dtype=object)[:bs],
            workload=np.full(bs, "other", dtype=object),
            req_pool_index=_np(kw["req_pool_indices"]).astype(np.int64),
            prefix_len=_np(kw["prefix_lens"]).astype(np.int64),
            verify_len=_np(verify_len),
            correct_drafts=_np(cl),
            acc_len=_np(kw["commit_lens"]).astype(np.int64),
            cap_trim=_np(kw["cap_trim_lens"]).astype(np.int64),
            bonus_token=_np(bonus),
            greedy=greedy_np,
            temperature=np.where(greedy_np == 1, 0.0, _np(temps).astype(np.float64)),
            shadow_ceiling=np.full(bs, -1, dtype=np.int64),
            bonus_logprob=_np(bonus_lp).astype(np.float64),
            draft_tokens=_np(draft).astype(np.int64),
            confidence=None if conf is None else _np(conf).astype(np.float64).reshape(bs, g),
            survival=None
            if conf is None
            else np.cumprod(_np(conf).astype(np.float64).reshape(bs, g), axis=1),
            confidence_logits=None if raw is None else _np(raw).astype(np.float64).reshape(bs, g),
            draft_logprobs=_np(draft_lp).astype(np.float64),
            target_logprobs=_np(target_lp).astype(np.float64),
        )

        def gather(rows: np.ndarray, positions: np.ndarray, tokens: np.ndarray) -> np.ndarray:
            r = torch.as_tensor(rows, device=device)
            lp = self.token_logprobs(
                target,
                r * rows_per_req + torch.as_tensor(positions, device=device),
                torch.as_tensor(tokens, device=device),
                temps[r],
            )
            return _np(lp).astype(np.float64)

        return batch, gather


class SGLangHook:
    """The pipeline a worker feeds; `observe` is what the wrapped observer call runs."""

    def __init__(self, pipeline: Pipeline, adapter: StepAdapter) -> None:
        self.pipeline = pipeline
        self.adapter = adapter
        self.failures = 0

    def observe(self, kw: dict[str, Any]) -> None:
        if kw.get("proposal_folded") or kw.get("target_logits") is None:
            return
        try:
            batch, gather = self.adapter.batch(kw)
            self.pipeline.ingest(batch, SOURCE, gather)
        except Exception as exc:  # the serving path must never see the hook fail
            self.failures += 1
            self.pipeline.stats.error(SOURCE, "hook_failed", repr(exc))


def attach(
    worker, *, gamma: int, mode: str = "compact", rank: int = 0, pipeline: Pipeline | None = None
) -> SGLangHook | None:
    """Wrap the worker's DSpark observers; None (one warning) where their interface differs."""
    observers = getattr(worker, "_observers", None)
    method = getattr(observers, "observe_verify_step", None)
    params = None
    if method is not None:
        params = {
            n for n, p in inspect.signature(method).parameters.items() if p.kind is p.KEYWORD_ONLY
        }
    if params != OBSERVER_PARAMETERS:
        warnings.warn(
            "dspark-obs: this SGLang worker's DSpark observer interface is not the one the hook "
            "knows (SGLang 0.5.23); the hook is not attached, poll /server_info instead",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    pipeline = pipeline or build_pipeline(gamma)
    hook = SGLangHook(pipeline, StepAdapter(gamma, mode, rank))

    def observe_verify_step(**kw):
        method(**kw)
        hook.observe(kw)

    observers.observe_verify_step = observe_verify_step
    return hook
