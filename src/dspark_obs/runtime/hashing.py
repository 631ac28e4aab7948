"""Counter-based randomness: every random number is a pure function of its keys.

The runtime draws nothing from a stateful generator on the token path. A draw
is `hash(seed, request salt, purpose, position, ...)`, so the same request at
the same position sees the same numbers whatever the verify mode, the batch it
shares, or the order of steps. That is what makes compact and cap-accept commit
identical token streams from one seed.

A hash is a chain, one splitmix per key, so keys that many draws share (seed,
salt, position) are hashed once with `mix` and each draw continues the chain
with `extend`: the value is the same as hashing every key afresh.

The runtime's largest draws are its `[rows, vocab]` tables of normals (`normal_table`),
which the compiled `_hashing` fills in one pass where it was built (`extensions.py`).
"""

from __future__ import annotations

import numpy as np

from .. import extensions

_compiled = extensions.load("dspark_obs.runtime._hashing")

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S16 = np.uint64(16)
_S32 = np.uint64(32)
_LANES16 = np.uint64(0x0000FFFF0000FFFF)
_LOW32 = np.uint64(0xFFFFFFFF)
_INV_2_53 = 1.0 / float(1 << 53)
_S11 = np.uint64(11)
#: An integer n < 2**52 ORed into the mantissa of 2**52 reads as the double 2**52 + n.
_EXPONENT_2_52 = np.uint64(0x4330000000000000)
_NORMAL_OFFSET = float(2**52 + 2**17)  # 2**52 plus the Irwin-Hall mean, 4 x 2**15
_NORMAL_SCALE = 1.7320508075688772 / 65536.0
_IN_PLACE_SIZE = 1024


def _splitmix(x: np.ndarray) -> np.ndarray:
    """One splitmix64 round.

    In place on large arrays (`x` is always the caller's fresh xor), where
    allocating temporaries costs more than the arithmetic; small arrays take
    numpy's out-of-place calls, which cost less per call.
    """
    if x.size < _IN_PLACE_SIZE:
        x = x + _GOLDEN
        x = (x ^ (x >> _S30)) * _M1
        x = (x ^ (x >> _S27)) * _M2
        return x ^ (x >> _S31)
    x += _GOLDEN
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


def _key(k: np.ndarray | int) -> np.ndarray:
    if isinstance(k, np.ndarray) and k.dtype == np.uint64:
        return k
    return np.asarray(k).astype(np.uint64)


def extend(h: np.ndarray, *keys: np.ndarray | int) -> np.ndarray:
    """Continue the hash chain `h` (a `mix` result): `extend(mix(a), b) == mix(a, b)`."""
    with np.errstate(over="ignore"):
        for k in keys:
            h = _splitmix(h ^ _key(k))
        return h


def mix(*keys: np.ndarray | int) -> np.ndarray:
    """Hash any number of integer keys (broadcast together) into uint64."""
    return extend(np.asarray(0, dtype=np.uint64), *keys)


def uniform(*keys: np.ndarray | int) -> np.ndarray:
    """Uniform in [0, 1) with 53 bits, keyed."""
    return unit(mix(*keys))


def unit(h: np.ndarray) -> np.ndarray:
    """Uniform in [0, 1) with 53 bits from hashes."""
    return (h >> _S11).astype(np.float64) * _INV_2_53


def normal(*keys: np.ndarray | int) -> np.ndarray:
    """Approximately standard normal (Irwin-Hall of four 16-bit uniforms), keyed.

    Cheap enough to fill `[batch, vocab]` logit tables every step; the exact
    shape of the tails does not matter to the synthetic language.
    """
    return gaussian(mix(*keys))


def normal_table(keys: np.ndarray, width: int, tag: int) -> np.ndarray:
    """`normal(keys[:, None], range(width), tag)`: a row of `width` keyed normals for each
    key, float64 `[len(keys), width]`, the same bits in either form."""
    keys = np.ascontiguousarray(_key(keys)).reshape(-1)
    if _compiled is not None:
        return _compiled.normal_table(keys, width, tag)
    return normal(keys[:, None], np.arange(width, dtype=np.uint64)[None, :], tag)


def gaussian(h: np.ndarray) -> np.ndarray:
    """`normal` from hashes, overwriting `h`.

    Whole-array integer steps only: the four 16-bit fields are summed pairwise
    in 32-bit lanes, and the sum (< 2**18) becomes a double through the
    exponent bits, exactly, where numpy's uint64 conversion is a scalar loop.
    """
    with np.errstate(over="ignore"):
        h = np.asarray(h)
        pairs = h & _LANES16
        h >>= _S16
        h &= _LANES16
        pairs += h
        np.right_shift(pairs, _S32, out=h)
        pairs &= _LOW32
        pairs += h
        pairs |= _EXPONENT_2_52
    total = pairs.view(np.float64)
    total -= _NORMAL_OFFSET
    total *= _NORMAL_SCALE
    return total
