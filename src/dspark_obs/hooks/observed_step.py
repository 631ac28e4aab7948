"""One `observe_verify_step` call of SGLang's DSpark worker, as the tensors the hook reads.

Built on the serving thread, so it only takes references: no view, no copy, no dtype
change, no kernel launch (on a GPU each torch call costs the serving thread
microseconds). Each device pass (the Triton kernel, or the torch form) reads these
tensors in their own dtypes and shapes: per-request vectors hold request b at flat
index b (SGLang's are contiguous, `[bs]` or `[bs, 1]`, possibly longer than bs).

Which SGLang settings give what (SGLang 0.5.23):

- a folded proposal (`SGLANG_DSPARK_FOLDED_PROPOSAL`, on by default, with CUDA
  graphs) hands over the draft sampler's in-graph buffers (`draft_sampler.step_logits
  [:bs]` as `corrected_logits`). They are the current block's in stream order: the
  draft graph that fills them runs before this verify and the next one after it,
  and the hook's pass is enqueued in between. The one exception is the megakernel
  sampler, which leaves temperature-0 rows unwritten; the hook reads draft logits
  only for sampled requests' tails, never for those rows;
- a greedy draft (`SGLANG_DSPARK_USE_GREEDY_DRAFT=1`) has no corrected logits: the
  draft is an argmax, its distribution one-hot, so log q = 0 for every drafted token;
- greedy requests (temperature 0) need tokens alone: their ceiling is the matching
  run of committed tokens, so no logit row of theirs is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class ObservedStep:
    """Slotted and built positionally: on the serving thread, whose caches SGLang's own work
    has cooled by the time its observers run, every object and dict the hook touches costs
    a fetch."""

    forward_ct: int
    bs: int
    budget: int | None
    verify_tokens: int
    draft: Any  # [bs, gamma]
    verify_lens: Any  # anchor + window per request, or None: every window is gamma (static)
    accepted: Any
    committed: Any
    cap_trim: Any
    bonus: Any
    prefix: Any
    pool: Any
    greedy: Any  # bool: the request samples at temperature 0
    temperature: Any  # the target's sampling temperature
    draft_temperature: Any
    confidence: Any  # [bs, gamma] or None
    confidence_raw: Any
    target_logits: Any  # [bs * (gamma + 1), V] or None
    draft_logits: Any  # [bs, gamma, W] or None (greedy draft)
    greedy_draft: bool

    @classmethod
    def from_observer(cls, kw: dict[str, Any]) -> ObservedStep:
        block = kw["draft_block"]
        info = kw["sampling_info"]
        logits = block.corrected_logits
        greedy_draft = bool(getattr(block, "greedy_draft", logits is None))
        layout = kw["layout"]
        budget = kw["verify_token_budget"]
        temperatures = block.temperatures
        return cls(
            int(kw["forward_ct"]),
            int(kw["bs"]),
            None if budget is None else int(budget),
            int(kw["verify_tier_num_tokens"]),
            kw["draft_tokens"],
            None if layout is None else layout.verify_lens,
            kw["correct_len"],
            kw["commit_lens"],
            kw["cap_trim_lens"],
            kw["bonus"],
            kw["prefix_lens"],
            kw["req_pool_indices"],
            block.greedy_mask,
            temperatures if info is None else info.temperatures,
            temperatures,
            kw["confidence"],
            kw["confidence_raw"],
            kw["target_logits"],
            None if greedy_draft else logits,
            greedy_draft,
        )
