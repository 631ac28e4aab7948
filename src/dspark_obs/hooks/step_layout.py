"""The packed step: one verify step of one rank as a `[bs, width]` float64 block.

The hook's device pass writes every per-request number a StepBatch needs into one
such block, so that a step leaves the GPU as one copy, and the consumer reads it
back by the same names. float64 holds every field exactly: token ids, lengths and
pool slots stay far below 2**53, and log-probabilities and confidences are float32
values. Absent values are NaN (-1 for a gather slot's offset).
"""

from __future__ import annotations

#: Open tails kept per request slot on the device. A slot holds more than one only while
#: an older tail's run of matches outlives the step that opened the next; beyond this
#: many the oldest is evicted (its last gather is lost, and counted).
TAIL_ENTRIES = 4


class StepLayout:
    """Column ranges of a packed step, for one gamma."""

    def __init__(self, gamma: int, entries: int = TAIL_ENTRIES) -> None:
        self.gamma, self.entries = gamma, entries
        #: gather slots per request: every open tail of its slot, and the one it opens now
        self.gathers = entries + 1
        g, n = gamma, self.gathers
        spans = (
            ("window", 1),
            ("accepted", 1),
            ("committed", 1),
            ("cap_trim", 1),
            ("bonus", 1),
            ("prefix", 1),
            ("pool", 1),
            ("greedy", 1),
            ("temperature", 1),
            ("bonus_logprob", 1),
            ("evicted", 1),
            ("draft", g),
            ("confidence", g),
            ("confidence_raw", g),
            ("target_logprob", g),
            ("draft_logprob", g),
            ("gather_offset", n),
            ("gather_token", n),
            ("gather_logprob", n),
        )
        self.columns: dict[str, slice] = {}
        at = 0
        for name, size in spans:
            self.columns[name] = slice(at, at + size)
            at += size
        self.width = at

    def col(self, name: str) -> int:
        """The column of a one-wide field."""
        return self.columns[name].start
