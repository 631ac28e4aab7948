"""Speculative acceptance, greedy and sampled, vectorised over a batch of rows.

Sampled acceptance is the standard rule that keeps the output distributed as
the target: accept a drafted token x with probability min(1, p(x)/q(x)); at the
first rejection, draw the replacement from the residual max(0, p - q),
renormalised. Greedy acceptance keeps a draft iff it is the target's argmax.
Every random draw comes in as a uniform, so callers decide where randomness
comes from (the runtime keys it per request and position).
"""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of `logits / temperature` (temperature `[rows]`)."""
    z = logits / temperature[:, None]
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def sample(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw per row: the first index whose cumulative mass exceeds u·total."""
    cdf = np.cumsum(probs, axis=1)
    threshold = u * cdf[:, -1]
    idx = (cdf <= threshold[:, None]).sum(axis=1)
    return np.minimum(idx, probs.shape[1] - 1)


def accept_probability(p_logprob: np.ndarray, q_logprob: np.ndarray) -> np.ndarray:
    """min(1, p(x)/q(x)) for the drafted token x."""
    return np.exp(np.minimum(p_logprob - q_logprob, 0.0))


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """max(0, p - q) per row; falls back to p where p == q leaves no mass."""
    r = np.maximum(p - q, 0.0)
    empty = r.sum(axis=1) <= 0.0
    if empty.any():
        r[empty] = p[empty]
    return r


def leading_run(accepted: np.ndarray) -> np.ndarray:
    """Number of leading True per row of a `[rows, gamma]` bool array."""
    return np.cumprod(accepted, axis=1, dtype=np.int64).sum(axis=1)
