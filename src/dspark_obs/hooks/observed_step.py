"""One `observe_verify_step` call of SGLang's DSpark worker, as the tensors the hook reads.

Built on the serving thread, so it only takes views: no copy, no dtype change, no
kernel launch. Each device pass (the Triton kernel, or the torch form) reads these
tensors in their own dtypes.

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


@dataclass
class ObservedStep:
    forward_ct: int
    bs: int
    rids: list
    budget: int | None
    verify_tokens: int
    draft: Any  # [bs, gamma]
    verify_lens: Any  # [bs] anchor + window, or None: every window is gamma (static)
    accepted: Any  # [bs]
    committed: Any
    cap_trim: Any
    bonus: Any
    prefix: Any
    pool: Any
    greedy: Any  # [bs] bool: the request samples at temperature 0
    temperature: Any  # [bs] the target's sampling temperature
    draft_temperature: Any  # [bs]
    confidence: Any  # [bs, gamma] or None
    confidence_raw: Any
    target_logits: Any  # [bs * (gamma + 1), V] or None
    draft_logits: Any  # [bs, gamma, W] or None (greedy draft)
    greedy_draft: bool

    @classmethod
    def from_observer(cls, kw: dict[str, Any]) -> ObservedStep:
        bs = int(kw["bs"])
        block = kw["draft_block"]
        info = kw["sampling_info"]
        temps = info.temperatures if info is not None else block.temperatures
        greedy_draft = bool(getattr(block, "greedy_draft", block.corrected_logits is None))
        layout = kw["layout"]
        budget = kw["verify_token_budget"]
        return cls(
            forward_ct=int(kw["forward_ct"]),
            bs=bs,
            rids=[r.rid for r in kw["reqs"][:bs]],
            budget=None if budget is None else int(budget),
            verify_tokens=int(kw["verify_tier_num_tokens"]),
            draft=kw["draft_tokens"][:bs],
            verify_lens=None if layout is None else layout.verify_lens.reshape(-1)[:bs],
            accepted=kw["correct_len"].reshape(-1)[:bs],
            committed=kw["commit_lens"].reshape(-1)[:bs],
            cap_trim=kw["cap_trim_lens"].reshape(-1)[:bs],
            bonus=kw["bonus"].reshape(-1)[:bs],
            prefix=kw["prefix_lens"].reshape(-1)[:bs],
            pool=kw["req_pool_indices"].reshape(-1)[:bs],
            greedy=block.greedy_mask.reshape(-1)[:bs],
            temperature=temps.reshape(-1)[:bs],
            draft_temperature=block.temperatures.reshape(-1)[:bs],
            confidence=kw["confidence"],
            confidence_raw=kw["confidence_raw"],
            target_logits=kw["target_logits"],
            draft_logits=None if greedy_draft else block.corrected_logits,
            greedy_draft=greedy_draft,
        )
