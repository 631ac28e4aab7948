"""The block drafter and its confidence head.

One call drafts gamma tokens. Position j sees the target's logits along the
drafted prefix (what the drafter was distilled to imitate) blurred by noise
that is keyed on the anchor and on the previous drafted token (the Markov
head), and whose weight grows along the block: quality decays with depth, as
in a real block drafter. The draft distribution is exact, so its
log-probabilities are too.

The confidence head scores each drafted token. Its raw logit tracks the true
acceptance probability but is over-confident by a position-dependent factor and
noisy, which is what STS exists to correct.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hashing import extend, mix, normal

_TAG_DRAFT_NOISE = 21
_TAG_CONF_NOISE = 22


@dataclass(frozen=True)
class DrafterConfig:
    fidelity: float = 0.97
    decay: float = 0.965
    confidence_slope: float = 2.4
    confidence_slope_growth: float = 0.15
    confidence_bias: float = 0.0
    confidence_noise: float = 0.35


def _row_std(x: np.ndarray) -> np.ndarray:
    """`x.std(axis=1, keepdims=True)`, the same operations without `np.std`'s per-call
    overhead, which is most of its cost at a few rows."""
    mean = x.sum(axis=1, keepdims=True)
    mean /= x.shape[1]
    dev = x - mean
    dev *= dev
    var = dev.sum(axis=1, keepdims=True)
    var /= x.shape[1]
    return np.sqrt(var, out=var)


class BlockDrafter:
    def __init__(self, config: DrafterConfig, gamma: int, vocab_size: int, seed: int) -> None:
        self.config = config
        self.gamma = gamma
        self.seed = np.uint64(seed)
        self._vocab = np.arange(vocab_size, dtype=np.uint64)[None, :]
        self._positions = np.arange(gamma)
        j = np.arange(gamma)
        self.rho = np.clip(config.fidelity * config.decay**j, 0.0, 1.0)
        self.slope = config.confidence_slope + config.confidence_slope_growth * j

    def block_keys(self, salt: np.ndarray, prefix: np.ndarray, anchor: np.ndarray) -> np.ndarray:
        """`[rows, gamma]` hash-chain prefixes of the block's noise keys.

        The key of position j is (seed, salt, position, anchor, previous draft,
        j); all but the last two are known before drafting, so they are hashed
        once per block rather than once per position.
        """
        pos = prefix[:, None] + self._positions
        return extend(mix(self.seed, salt)[:, None], pos, anchor[:, None])

    def logits(
        self, target_logits: np.ndarray, block_key: np.ndarray, prev_draft: np.ndarray, j: int
    ) -> np.ndarray:
        """Draft logits at block position j; `block_key` is that column of `block_keys`."""
        rho = self.rho[j]
        spread = _row_std(target_logits)
        key = extend(block_key, prev_draft, j)
        noise = normal(key[:, None], self._vocab, _TAG_DRAFT_NOISE)
        noise *= np.sqrt(1.0 - rho * rho) * spread
        out = rho * target_logits
        out += noise
        return out

    @staticmethod
    def greedy_accept_signal(target_prob: np.ndarray) -> np.ndarray:
        """Calibrated chance that a greedy draft is the target's argmax, from p(draft).

        A token holding a fair share of the target's mass is usually its
        argmax; this logistic map was fitted on the runtime's own greedy blocks
        so that the head's underlying signal is calibrated and the miscalibration
        left for STS is the slope it applies.
        """
        p = np.clip(target_prob, 1e-6, 1.0 - 1e-6)
        return 1.0 / (1.0 + np.exp(-(1.7 * (np.log(p) - np.log1p(-p)) + 4.5)))

    def confidence_logits(
        self, accept_prob: np.ndarray, salt: np.ndarray, pos: np.ndarray
    ) -> np.ndarray:
        """Raw confidence logits `[rows, gamma]` from each position's acceptance probability."""
        p = np.clip(accept_prob, 1e-4, 1.0 - 1e-4)
        true_logit = np.log(p) - np.log1p(-p)
        j = np.arange(self.gamma, dtype=np.uint64)[None, :]
        noise = normal(mix(self.seed, salt, pos)[:, None], j, _TAG_CONF_NOISE)
        c = self.config
        return self.slope[None, :] * true_logit + c.confidence_bias + c.confidence_noise * noise
