"""Counter-based randomness: every random number is a pure function of its keys.

The runtime draws nothing from a stateful generator on the token path. A draw
is `hash(seed, request salt, purpose, position, ...)`, so the same request at
the same position sees the same numbers whatever the verify mode, the batch it
shares, or the order of steps. That is what makes compact and cap-accept commit
identical token streams from one seed.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_MASK16 = np.uint64(0xFFFF)
_INV_2_53 = 1.0 / float(1 << 53)
_S11 = np.uint64(11)


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def mix(*keys: np.ndarray | int) -> np.ndarray:
    """Hash any number of integer keys (broadcast together) into uint64."""
    with np.errstate(over="ignore"):
        h = np.asarray(0, dtype=np.uint64)
        for k in keys:
            h = _splitmix(h ^ np.asarray(k).astype(np.uint64))
        return h


def uniform(*keys: np.ndarray | int) -> np.ndarray:
    """Uniform in [0, 1) with 53 bits, keyed."""
    return (mix(*keys) >> _S11).astype(np.float64) * _INV_2_53


def normal(*keys: np.ndarray | int) -> np.ndarray:
    """Approximately standard normal (Irwin-Hall of four 16-bit uniforms), keyed.

    Cheap enough to fill `[batch, vocab]` logit tables every step; the exact
    shape of the tails does not matter to the synthetic language.
    """
    h = mix(*keys)
    total = (
        (h & _MASK16)
        + ((h >> np.uint64(16)) & _MASK16)
        + ((h >> np.uint64(32)) & _MASK16)
        + (h >> np.uint64(48))
    ).astype(np.float64)
    return (total * (1.0 / 65536.0) - 2.0) * 1.7320508075688772
