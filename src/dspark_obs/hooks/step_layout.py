"""The packed step: one verify step of one rank as a `[bs, width]` float64 block.

The hook's device pass writes every per-request number a StepBatch needs into one
such block, so that a step leaves the GPU as one copy, and the consumer reads it
back by the same names. float64 holds every field exactly: token ids, lengths and
pool slots stay far below 2**53, and log-probabilities and confidences are float32
values. Absent values are NaN (-1 for a gather slot's offset).

This module is the one definition of the block's columns and of the step's flag bits:
the torch form, the Triton kernel (which takes every column's start as a compile-time
constant, `pack_triton.kernel_constants`), the vLLM pass and the consumer all read them
from here.
"""

from __future__ import annotations

#: Open tails kept per request slot on the device. A slot holds more than one only while
#: an older tail's run of matches outlives the step that opened the next; beyond this
#: many the oldest is evicted (its last gather is lost, and counted).
TAIL_ENTRIES = 4

#: Fields one column wide, first and in this order (the vLLM pass writes `prefix` to
#: `temperature` as one adjacent range).
SCALARS = (
    "window",
    "accepted",
    "committed",
    "cap_trim",
    "bonus",
    "prefix",
    "pool",
    "greedy",
    "temperature",
    "bonus_logprob",
    "evicted",
)
#: Fields with one column per draft position (gamma wide), after the scalars.
PER_DRAFT = ("draft", "confidence", "confidence_raw", "target_logprob", "draft_logprob")
#: Fields with one column per gather slot (entries + 1 wide), last.
PER_GATHER = ("gather_offset", "gather_token", "gather_logprob")

# The step's flag bits: which optional inputs a step has. The ring stores them with each
# step (`shared_ring.M_FLAGS`), and the Triton kernel is compiled for them.
HAS_CONFIDENCE, HAS_RAW, HAS_TARGET, HAS_BUDGET, GREEDY_DRAFT = 1, 2, 4, 8, 16
HAS_VERIFY_LENS, HAS_DRAFT_LOGITS = 32, 64


def step_flags(step) -> int:
    """The flag bits of an `ObservedStep`."""
    return (
        (HAS_CONFIDENCE if step.confidence is not None else 0)
        | (HAS_RAW if step.confidence_raw is not None else 0)
        | (HAS_TARGET if step.target_logits is not None else 0)
        | (HAS_BUDGET if step.budget is not None else 0)
        | (GREEDY_DRAFT if step.greedy_draft else 0)
        | (HAS_VERIFY_LENS if step.verify_lens is not None else 0)
        | (HAS_DRAFT_LOGITS if step.draft_logits is not None else 0)
    )


class StepLayout:
    """Column ranges of a packed step, for one gamma."""

    def __init__(self, gamma: int, entries: int = TAIL_ENTRIES) -> None:
        self.gamma, self.entries = gamma, entries
        #: gather slots per request: every open tail of its slot, and the one it opens now
        self.gathers = entries + 1
        spans = (
            *((name, 1) for name in SCALARS),
            *((name, gamma) for name in PER_DRAFT),
            *((name, self.gathers) for name in PER_GATHER),
        )
        self.columns: dict[str, slice] = {}
        at = 0
        for name, size in spans:
            self.columns[name] = slice(at, at + size)
            at += size
        self.width = at

    def col(self, name: str) -> int:
        """The first column of a field (the only one of a scalar)."""
        return self.columns[name].start
