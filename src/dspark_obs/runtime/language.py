"""The target: a seeded synthetic language whose next-token distribution is exact.

The logits at a position are a pure function of (request salt, position, the
two previous tokens), so the target's distribution is known exactly wherever
the runtime needs it and costs one hash per vocabulary entry. A workload sets
how peaked those distributions are, which is what makes gsm8k-like traffic easy
to draft and poetry-like traffic hard.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .hashing import extend, gaussian, mix, normal_table, unit

EOS_TOKEN = 0

_TAG_LOGIT = 11
_TAG_SCALE = 12
_TAG_PEAK = 13
_TAG_EOS = 14
_TAG_PEAK_TOKEN = 15
_SHAPE_TAGS = np.array([_TAG_SCALE, _TAG_PEAK_TOKEN, _TAG_PEAK, _TAG_EOS], dtype=np.uint64)[:, None]


@dataclass(frozen=True)
class WorkloadProfile:
    """How predictable a workload's text is.

    `peak` lifts one token per context above the rest (in units of the logit
    scale): large for reasoning traces that copy and compute, small for verse.
    `mean_output_len` sets the EOS rate. `draft_fidelity` scales how closely the
    drafter imitates this workload's text (1: as well as the drafter can).
    """

    name: str
    peak: float
    scale: float = 1.6
    mean_output_len: float = 160.0
    prompt_len: int = 256
    draft_fidelity: float = 1.0


#: The article's three example workloads, from easy to hard to draft.
PRESETS: dict[str, WorkloadProfile] = {
    "gsm8k": WorkloadProfile("gsm8k", peak=7.0, mean_output_len=180.0),
    "arena": WorkloadProfile("arena", peak=4.5, mean_output_len=240.0),
    "poetry": WorkloadProfile("poetry", peak=2.6, mean_output_len=120.0),
}


def parse_workload(spec: str) -> WorkloadProfile:
    """`NAME` (a preset), `NAME=PRESET` (a preset renamed) or `NAME=PEAK` (a number)."""
    name, _, rhs = spec.partition("=")
    name = name.strip()
    if not name:
        raise ValueError(f"workload {spec!r}: empty name")
    rhs = rhs.strip() or name
    if rhs in PRESETS:
        return replace(PRESETS[rhs], name=name)
    try:
        peak = float(rhs)
    except ValueError:
        raise ValueError(
            f"workload {spec!r}: {rhs!r} is neither a preset ({', '.join(PRESETS)}) nor a number"
        ) from None
    if not np.isfinite(peak) or peak < 0:
        raise ValueError(f"workload {spec!r}: peak must be a finite number >= 0")
    return WorkloadProfile(name, peak)


class SyntheticTarget:
    """Exact next-token logits of the synthetic language, vectorised over rows."""

    def __init__(self, workloads: list[WorkloadProfile], vocab_size: int, seed: int) -> None:
        if vocab_size < 4:
            raise ValueError("vocab_size must be at least 4")
        self.vocab_size = vocab_size
        self.seed = np.uint64(seed)
        self.peak = np.array([w.peak for w in workloads])
        self.scale = np.array([w.scale for w in workloads])
        self.eos_rate = np.array([1.0 / max(w.mean_output_len, 1.0) for w in workloads])

    def position_keys(self, salt: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The (seed, salt, position) prefix of context keys.

        A block's positions are known before it is drafted, so the runtime
        hashes them once per block; each draft then only adds its two tokens.
        """
        return mix(self.seed, salt, pos)

    def context_key(
        self, salt: np.ndarray, pos: np.ndarray, prev2: np.ndarray, prev1: np.ndarray
    ) -> np.ndarray:
        return extend(self.position_keys(salt, pos), prev2, prev1)

    def logits(self, key: np.ndarray, workload: np.ndarray) -> np.ndarray:
        """`[rows, vocab]` logits at the contexts `key` (uint64 `[rows]`)."""
        return self.shape(key, normal_table(key, self.vocab_size, _TAG_LOGIT), workload)

    def logits_at(
        self,
        position_key: np.ndarray,
        prev2: np.ndarray,
        prev1: np.ndarray,
        workload: np.ndarray,
    ) -> np.ndarray:
        """Logits after tokens `prev2, prev1` at the positions of `position_keys`."""
        return self.logits(extend(position_key, prev2, prev1), workload)

    def shape(self, key: np.ndarray, base: np.ndarray, workload: np.ndarray) -> np.ndarray:
        """Turn unit-scale base logits into the workload's language: scale, peak token, EOS.

        The base term is where targets differ (a hash here, a network in the
        torch target); the workload's difficulty lives entirely in this shaping,
        so both targets order workloads the same way. `base` is a fresh table in
        every caller and is shaped in place, saving a `[rows, vocab]` pass per
        block position.
        """
        draws = extend(mix(key), _SHAPE_TAGS)  # the context's four draws, one chain prefix
        scale = self.scale[workload] * np.exp(0.35 * gaussian(draws[0]))
        out = base
        out *= scale[:, None]
        rows = np.arange(len(key))
        peak_token = 1 + (draws[1] % np.uint64(self.vocab_size - 1)).astype(np.int64)
        peak = self.peak[workload] * (0.5 + unit(draws[2]))
        out[rows, peak_token] += peak * scale
        # an ending context lifts EOS above the row's maximum; rare, so only its rows are read
        ends = np.flatnonzero(unit(draws[3]) < self.eos_rate[workload])
        eos = out[:, EOS_TOKEN] - 4.0
        eos[ends] = out[ends].max(axis=1) + 3.0
        out[:, EOS_TOKEN] = eos
        return out
