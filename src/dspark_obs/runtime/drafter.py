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

A world (`worlds.py`) may make a request's fidelity lower by a factor the head is
not told, lift a fixed set of token ids in every draft row (the drafter proposes them
more often than the target would), or score tokens by the draft's own probability.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hashing import extend, mix, normal_table, uniform
from .worlds import REFERENCE, World

_TAG_DRAFT_NOISE = 21
_TAG_CONF_NOISE = 22
_TAG_DIFFICULTY = 23
_TAG_HARD_TOKEN = 24
#: draft probabilities are kept inside (eps, 1 - eps) before their logit is taken
_PROB_EPS = 1e-6


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
    def __init__(
        self,
        config: DrafterConfig,
        gamma: int,
        vocab_size: int,
        seed: int,
        world: World = REFERENCE,
        workload_fidelity: np.ndarray | None = None,
    ) -> None:
        self.config = config
        self._workload_fidelity = np.ones(1) if workload_fidelity is None else workload_fidelity
        self.world = world
        self.gamma = gamma
        self.seed = np.uint64(seed)
        self.vocab_size = vocab_size
        self._positions = np.arange(gamma)
        j = np.arange(gamma)
        self.rho = np.clip(config.fidelity * config.decay**j, 0.0, 1.0)
        self.slope = config.confidence_slope + config.confidence_slope_growth * j
        token = np.arange(vocab_size, dtype=np.uint64)
        hard = uniform(self.seed, token, _TAG_HARD_TOKEN) < world.hard_token_share
        hard[0] = False  # EOS keeps its reference odds: lengths stay comparable across worlds
        #: token ids the drafter over-proposes; empty in the reference world
        self.hard_tokens = np.flatnonzero(hard)
        self._lift = world.hard_token_lift * hard[None, :]

    def fidelity_factor(self, salt: np.ndarray, workload: np.ndarray) -> np.ndarray | None:
        """Each row's factor on fidelity (None: all 1): its workload's `draft_fidelity`
        times the request's hidden factor, uniform in [1 - spread, 1]."""
        spread = self.world.difficulty_spread
        if spread == 0.0 and (self._workload_fidelity == 1.0).all():
            return None
        hidden = 1.0 - spread * uniform(self.seed, salt, _TAG_DIFFICULTY)
        return self._workload_fidelity[workload] * hidden

    def block_keys(self, salt: np.ndarray, prefix: np.ndarray, anchor: np.ndarray) -> np.ndarray:
        """`[rows, gamma]` hash-chain prefixes of the block's noise keys.

        The key of position j is (seed, salt, position, anchor, previous draft,
        j); all but the last two are known before drafting, so they are hashed
        once per block rather than once per position.
        """
        pos = prefix[:, None] + self._positions
        return extend(mix(self.seed, salt)[:, None], pos, anchor[:, None])

    def logits(
        self,
        target_logits: np.ndarray,
        block_key: np.ndarray,
        prev_draft: np.ndarray,
        j: int,
        fidelity: np.ndarray | None = None,
    ) -> np.ndarray:
        """Draft logits at block position j; `block_key` is that column of `block_keys`,
        `fidelity` the rows' `fidelity_factor`."""
        rho = self.rho[j] if fidelity is None else (self.rho[j] * fidelity)[:, None]
        spread = _row_std(target_logits)
        key = extend(block_key, prev_draft, j)
        noise = normal_table(key, self.vocab_size, _TAG_DRAFT_NOISE)
        noise *= np.sqrt(1.0 - rho * rho) * spread
        out = rho * target_logits
        out += noise
        if len(self.hard_tokens):
            out += spread * self._lift
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
        noise = normal_table(mix(self.seed, salt, pos), self.gamma, _TAG_CONF_NOISE)
        c = self.config
        return self.slope[None, :] * true_logit + c.confidence_bias + c.confidence_noise * noise

    @staticmethod
    def draft_probability_logits(draft_logprob: np.ndarray) -> np.ndarray:
        """Raw confidence logits that are the logit of the draft's probability of its token:
        a head that knows only how sure the drafter was, not how the target will judge it."""
        q = np.clip(np.exp(draft_logprob), _PROB_EPS, 1.0 - _PROB_EPS)
        return np.log(q) - np.log1p(-q)
