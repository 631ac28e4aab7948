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

from .hashing import mix, normal

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


class BlockDrafter:
    def __init__(self, config: DrafterConfig, gamma: int, vocab_size: int, seed: int) -> None:
        self.config = config
        self.gamma = gamma
        self.seed = np.uint64(seed)
        self._vocab = np.arange(vocab_size, dtype=np.uint64)[None, :]
        j = np.arange(gamma)
        self.rho = np.clip(config.fidelity * config.decay**j, 0.0, 1.0)
        self.slope = config.confidence_slope + config.confidence_slope_growth * j

    def logits(
        self,
        target_logits: np.ndarray,
        salt: np.ndarray,
        pos: np.ndarray,
        anchor: np.ndarray,
        prev_draft: np.ndarray,
        j: int,
    ) -> np.ndarray:
        rho = self.rho[j]
        spread = target_logits.std(axis=1, keepdims=True)
        key = mix(self.seed, salt, pos, anchor, prev_draft, j)
        noise = normal(key[:, None], self._vocab, _TAG_DRAFT_NOISE)
        return rho * target_logits + np.sqrt(1.0 - rho * rho) * spread * noise

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
