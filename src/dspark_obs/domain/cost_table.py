"""The additive step-cost table the scheduler sizes budgets with (SGLang's SPS form).

`T(bs, K) = bias + alpha(bs) + theta(bs + K)`: alpha is the per-request part
(draft pass, attention) that trimming cannot reduce; theta the verify-token
part that it can. The JSON form is SGLang's `SpsAdditiveCostTable`, in seconds,
so a table fitted on a real server drives the reference runtime unchanged.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from ..json_files import load_json_file


class AdditiveCostTable(msgspec.Struct, frozen=True):
    bias_seconds: float
    bs_probes: list[int]
    alpha_seconds: list[float]
    m_probes: list[int]
    theta_seconds: list[float]

    def __post_init__(self) -> None:
        for name, probes, values in (
            ("bs", self.bs_probes, self.alpha_seconds),
            ("m", self.m_probes, self.theta_seconds),
        ):
            if not probes:
                raise ValueError(f"cost table: {name}_probes is empty")
            if list(probes) != sorted(set(probes)):
                raise ValueError(f"cost table: {name}_probes must be strictly increasing")
            if len(probes) != len(values):
                raise ValueError(f"cost table: {name}_probes and its values differ in length")
            if not all(np.isfinite(values)) or min(values) < 0:
                raise ValueError(f"cost table: {name} values must be finite and >= 0")
        if not np.isfinite(self.bias_seconds) or self.bias_seconds <= 0:
            raise ValueError("cost table: bias_seconds must be > 0")

    def step_seconds(self, bs: np.ndarray | int, extra_tokens: np.ndarray | int) -> np.ndarray:
        """Predicted step time; vectorised over `extra_tokens` (and `bs`).

        Linear interpolation between probes, clamped at the ends (np.interp's
        own behaviour), exactly as SGLang evaluates the table.
        """
        bs = np.asarray(bs, dtype=np.float64)
        m = bs + np.asarray(extra_tokens, dtype=np.float64)
        return (
            self.bias_seconds
            + np.interp(bs, self.bs_probes, self.alpha_seconds)
            + np.interp(m, self.m_probes, self.theta_seconds)
        )

    def alpha(self, bs: float) -> float:
        return float(np.interp(bs, self.bs_probes, self.alpha_seconds))

    def theta(self, m: float) -> float:
        return float(np.interp(m, self.m_probes, self.theta_seconds))

    def to_json(self) -> str:
        return msgspec.json.encode(self).decode()


#: Query rows one attention tile holds; a verify block (anchor plus window) fits in one.
ATTENTION_QUERY_TILE = 64


def attention_seconds(context_cost: float, prefix_len: np.ndarray, verify_len: np.ndarray) -> float:
    """Simulated attention time of a verify step over its requests' contexts, seconds.

    `T_attn = context_cost * sum_i prefix_i * (1 + verify_len_i / ATTENTION_QUERY_TILE)`.
    Verify attends each request's verify block (anchor plus window) to that request's
    whole KV cache, and a block of a few tokens shares one query tile, so the cache is
    read once per request per step: memory-bound, the time follows the context tokens
    summed over the batch, not bs times its longest context (paged kernels walk each
    request's own pages). The window's tokens add the arithmetic of their query rows,
    a fraction `verify_len / ATTENTION_QUERY_TILE` of the read: a mild growth, so the
    cost is nearly, not exactly, linear in the step's context tokens, as on a GPU. The
    additive table T(bs, K) cannot express it: at one (bs, K) the time still grows
    as conversations do.
    """
    if context_cost == 0.0:
        return 0.0
    prefix = np.asarray(prefix_len, dtype=np.float64)
    tile = 1.0 + np.asarray(verify_len, dtype=np.float64) / ATTENTION_QUERY_TILE
    return context_cost * float(prefix @ tile)


class ContextCostTable(msgspec.Struct, frozen=True):
    """SGLang's additive table plus a term linear in the step's context tokens (ours).

    `T(bs, K, C) = additive.step_seconds(bs, K) + context_seconds_per_token * C`, with C
    the context tokens the step's requests attend to (the steps table's
    `context_tokens`). SGLang reads only the additive form, so this is written to a
    file of its own; the coefficient is the least-squares value and may come out
    slightly negative where context costs nothing.
    """

    additive: AdditiveCostTable
    context_seconds_per_token: float

    def __post_init__(self) -> None:
        if not np.isfinite(self.context_seconds_per_token):
            raise ValueError("context cost table: context_seconds_per_token must be finite")

    def step_seconds(self, bs, extra_tokens, context_tokens) -> np.ndarray:
        """Predicted step time; vectorised like `AdditiveCostTable.step_seconds`."""
        context = np.asarray(context_tokens, dtype=np.float64)
        return self.additive.step_seconds(bs, extra_tokens) + (
            self.context_seconds_per_token * context
        )

    def to_json(self) -> str:
        return msgspec.json.encode(self).decode()


def load_cost_table(path: str | Path) -> AdditiveCostTable:
    """The table in `path`; any problem is a ValueError that names the file."""
    return load_json_file(path, AdditiveCostTable, "cost table")


def default_cost_table() -> AdditiveCostTable:
    """An H200-like shape: verify is memory-bound (flat) to ~256 tokens, then compute-bound.

    That knee is what makes trimming pay only under load (the article's figure 3).
    """
    return AdditiveCostTable(
        bias_seconds=0.0020,
        bs_probes=[1, 8, 32, 64, 128, 256],
        alpha_seconds=[0.0005, 0.0006, 0.0010, 0.0015, 0.0025, 0.0045],
        m_probes=[1, 64, 128, 256, 512, 1024, 2048],
        theta_seconds=[0.0050, 0.0051, 0.0053, 0.0060, 0.0080, 0.0125, 0.0220],
    )


#: Token counts with a captured verify graph; packed verify tokens round up to one.
DEFAULT_CAPTURE_TIERS = (
    1,
    2,
    4,
    8,
    12,
    16,
    24,
    32,
    48,
    64,
    80,
    96,
    112,
    128,
    160,
    192,
    224,
    256,
    320,
    384,
    448,
    512,
    640,
    768,
    896,
    1024,
    1280,
    1536,
    1792,
    2048,
    2304,
)


def round_to_tier(tokens: int, tiers: tuple[int, ...] = DEFAULT_CAPTURE_TIERS) -> int:
    """Smallest captured tier holding `tokens` (the count itself past the largest tier)."""
    i = int(np.searchsorted(tiers, tokens))
    return tiers[i] if i < len(tiers) else int(tokens)


def round_to_tiers(tokens: np.ndarray, tiers: tuple[int, ...]) -> np.ndarray:
    """`round_to_tier` over an array: the smallest tier holding each."""
    t = np.asarray(tiers)
    i = np.searchsorted(t, tokens)
    return np.where(i < len(t), t[np.minimum(i, len(t) - 1)], tokens)


def repriced_seconds(
    table,
    bs: np.ndarray,
    tokens: np.ndarray,
    recorded_tier: np.ndarray,
    measured_s: np.ndarray,
    tiers: tuple[int, ...],
) -> np.ndarray:
    """`[steps]` each step's time had it packed `tokens` verify tokens instead of what it did.

    The tokens round up to the captured tier; a measured time is scaled by the table's
    ratio between that tier and the recorded one (NaN: the same tier), so a step's own
    tokens give back its measured time and its noise stays in every other price; an
    untimed step (NaN) takes the table's time. `table` is anything with
    `step_seconds(bs, extra_tokens)`. The what-if predictions and the live cost of
    trimming both price steps here.
    """
    bs = np.asarray(bs, dtype=np.float64)
    tier = round_to_tiers(tokens, tiers).astype(np.float64)
    new = table.step_seconds(bs, tier - bs)
    recorded = np.where(np.isnan(recorded_tier), tier, recorded_tier)
    old = table.step_seconds(bs, recorded - bs)
    return np.where(np.isnan(measured_s), new, measured_s * new / old)
