"""Traffic: which requests arrive, with what workload, sampling and length.

Requests are indexed in arrival order and every attribute is a keyed hash of
(seed, index), so two runs with one seed see the same requests whatever their
verify mode. Arrivals are closed-loop per concurrency level: a finished request
is replaced at the next step, which keeps the batch size at the level (the
article's concurrency sweep from 1 to 256).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hashing import mix, uniform

_TAG_SALT = 31
_TAG_WORKLOAD = 32
_TAG_GREEDY = 33
_TAG_PROMPT = 34
_TAG_TOKENS = 35


@dataclass
class NewRequests:
    index: np.ndarray  # arrival index, int64
    salt: np.ndarray  # uint64, keys every draw of the request
    workload: np.ndarray  # index into the workload list
    greedy: np.ndarray  # bool
    temperature: np.ndarray  # float; 1.0 for greedy rows (used only for log-probs)
    prompt_len: np.ndarray
    prev2: np.ndarray
    prev1: np.ndarray


class Traffic:
    def __init__(
        self,
        *,
        seed: int,
        mix_weights: list[float],
        greedy_fraction: float,
        temperature: float,
        prompt_lens: np.ndarray,
        vocab_size: int,
    ) -> None:
        w = np.asarray(mix_weights, dtype=np.float64)
        if len(w) == 0 or (w < 0).any() or w.sum() <= 0 or not np.isfinite(w).all():
            raise ValueError("workload mix weights must be >= 0 with a positive sum")
        if not 0.0 <= greedy_fraction <= 1.0:
            raise ValueError("greedy fraction must be within [0, 1]")
        if not (np.isfinite(temperature) and temperature > 0):
            raise ValueError("temperature must be > 0")
        self.seed = np.uint64(seed)
        self.cdf = np.cumsum(w / w.sum())
        self.greedy_fraction = greedy_fraction
        self.temperature = temperature
        self.prompt_lens = prompt_lens
        self.vocab_size = vocab_size

    def arrivals(self, start: int, count: int) -> NewRequests:
        index = np.arange(start, start + count, dtype=np.int64)
        workload = np.minimum(
            np.searchsorted(self.cdf, uniform(self.seed, index, _TAG_WORKLOAD), side="right"),
            len(self.cdf) - 1,
        )
        greedy = uniform(self.seed, index, _TAG_GREEDY) < self.greedy_fraction
        base = self.prompt_lens[workload]
        prompt_len = np.maximum(
            2, (base * (0.5 + uniform(self.seed, index, _TAG_PROMPT))).astype(np.int64)
        )
        tokens = mix(self.seed, index, _TAG_TOKENS)
        vocab = np.uint64(self.vocab_size - 1)
        return NewRequests(
            index=index,
            salt=mix(self.seed, index, _TAG_SALT),
            workload=workload,
            greedy=greedy,
            temperature=np.where(greedy, 1.0, self.temperature),
            prompt_len=prompt_len,
            prev2=(1 + tokens % vocab).astype(np.int64),
            prev1=(1 + (tokens >> np.uint64(32)) % vocab).astype(np.int64),
        )
