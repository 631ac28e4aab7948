"""One verify step of vLLM's GPU model runner, packed into the hook ring's block.

vLLM 0.33.0 samples a step in `GPUModelRunner.sample(hidden_states, input_batch,
grammar_output)`; when it returns, everything the step decided exists and nothing of it
has been overwritten yet:

- on the host: the batch's request ids, request-state slots (`idx_mapping_np`), the drafts
  the scheduler scheduled for each request (`num_draft_tokens_per_req`; the verification
  requests first, `sort_batch_req_ids` keeps them there), the tokens each had computed
  before the step, and each request's temperature (`sampling_states.temperature.np`);
- on the device: the sampler's verdict, `num_sampled` (accepted drafts plus the bonus) and
  `num_rejected` (admitted drafts not accepted: the verify window is their sum less the
  bonus, as vLLM's own acceptance estimator counts it), the sampled tokens, the drafts of
  each slot (`req_states.draft_tokens`, overwritten only after the next proposal), and,
  with adaptive verification, the per-slot confidences the admission ranked
  (`AdaptiveVerificationManager._confidence_probs`, overwritten only by the next
  `record_confidences`).

The pass reads those by reference on the serving thread and enqueues a few gathers and
copies on the step's stream: the host values go through a page-locked staging row per
ring slot (a slot is written again only after the consumer released the step that used
it, so a staging row is never rewritten while its copy may be pending). Nothing waits.
Drafts past a request's scheduled count are written as -1: no draft exists there, so a
ceiling never reaches past what the scheduler scheduled. The columns vLLM has no value
for (cap-trim, the walk's log-probabilities and gathers) keep the layout's absent
values, so a sampled request's ceiling stays an interval and a greedy one is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .step_layout import StepLayout

#: the host columns, in the layout's order (prefix, pool, greedy and temperature are
#: adjacent there), then the scheduled drafts the pass masks the drafts with
HOST_COLUMNS = ("prefix", "pool", "greedy", "temperature")
#: a staging row's width: the host columns and the scheduled drafts
HOST_WIDTH = len(HOST_COLUMNS) + 1


def host_columns(layout: StepLayout) -> slice:
    """The layout's columns the host values fill, which both forms write as one range."""
    at = slice(layout.col(HOST_COLUMNS[0]), layout.col(HOST_COLUMNS[-1]) + 1)
    if at.stop - at.start != len(HOST_COLUMNS):
        raise ValueError("the layout's host columns are not adjacent")
    return at


def staging_rows(slots: int, max_bs: int, pin: bool) -> list:
    """A `[max_bs, HOST_WIDTH]` float64 block of host values per ring slot, page-locked
    where a device reads it: a slot's block is rewritten only once the consumer released
    the step whose pass read it, so a pending copy or launch never sees it change."""
    import torch

    return [torch.empty((max_bs, HOST_WIDTH), dtype=torch.float64, pin_memory=pin)
            for _ in range(slots)]  # fmt: skip


@dataclass(slots=True)
class VLLMStep:
    """References to one sampled step's verification rows (the first `bs` of the batch)."""

    bs: int
    slot: int  # the ring slot it goes to: selects the staging row
    idx: Any  # [>= bs] device: request-state slot per batch row
    num_sampled: Any  # [>= bs] device
    num_rejected: Any  # [>= bs] device
    sampled: Any  # [>= bs, k + 1] device: sampled tokens, the bonus at num_sampled - 1
    draft_table: Any  # [max_reqs, gamma] device, by request-state slot
    confidence_table: Any  # [max_reqs, gamma] device, by request-state slot, or None
    host: np.ndarray  # [bs, 5] float64: prefix, pool, greedy, temperature, scheduled


class VLLMPacker:
    """The packer protocol (`submit.Packer`) for vLLM's step."""

    by_address = False
    writes_stamp = False

    def __init__(self, layout: StepLayout, device, slots: int, max_bs: int) -> None:
        import torch

        self.layout = layout
        self.device = torch.device(device)
        lay, c = layout, layout.columns
        template = torch.full((max_bs, lay.width), float("nan"), dtype=torch.float64)
        template[:, lay.col("cap_trim")] = 0.0
        template[:, lay.col("evicted")] = 0.0
        template[:, c["gather_offset"]] = -1.0
        template[:, c["gather_token"]] = -1.0
        self.template = template.to(self.device)
        self.host_at = host_columns(lay)
        self.staging = staging_rows(slots, max_bs, pin=self.device.type == "cuda")
        self.staging_np = [s.numpy() for s in self.staging]
        self.host_dev = torch.empty((max_bs, HOST_WIDTH), dtype=torch.float64, device=self.device)
        self.positions = torch.arange(layout.gamma, device=self.device)
        self.scratch = torch.empty((max_bs, 3), dtype=torch.int64, device=self.device)

    def pack(self, step: VLLMStep, seq: int, stream: int, out, out_at: int) -> None:
        """Fill `out[:bs]` (`out` a [max_bs, width] float64 tensor on the step's device) with
        this step, on the current stream (`stream`)."""
        import torch

        lay, bs, c = self.layout, step.bs, self.layout.columns
        out = out[:bs]
        out.copy_(self.template[:bs])
        stage = self.staging_np[step.slot]
        stage[:bs] = step.host
        host = self.host_dev[:bs]
        host.copy_(self.staging[step.slot][:bs], non_blocking=True)
        out[:, self.host_at] = host[:, : len(HOST_COLUMNS)]
        # window, accepted, committed: num_sampled + num_rejected - 1, num_sampled - 1,
        # num_sampled (a row that sampled nothing verified nothing)
        ns = step.num_sampled[:bs]
        counts = self.scratch[:bs]
        torch.add(ns, step.num_rejected[:bs], out=counts[:, 0])
        counts[:, 1] = ns
        counts[:, :2] -= 1
        counts.clamp_(min=0)
        counts[:, 2] = ns
        out[:, lay.col("window") : lay.col("committed") + 1] = counts
        bonus = step.sampled[:bs].gather(1, counts[:, 1:2])
        out[:, lay.col("bonus") : lay.col("bonus") + 1] = bonus
        idx = step.idx[:bs]
        draft = step.draft_table[idx]
        draft.masked_fill_(self.positions[None, :] >= host[:, len(HOST_COLUMNS) :], -1)
        out[:, c["draft"]] = draft
        if step.confidence_table is not None:
            out[:, c["confidence"]] = step.confidence_table[idx]
