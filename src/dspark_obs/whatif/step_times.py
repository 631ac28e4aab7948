"""A policy's steps: their packed verify tokens and the time each would have taken."""

from __future__ import annotations

import numpy as np

from ..domain.cost_table import repriced_seconds
from .frame import RunFrame


def step_tokens(frame: RunFrame, windows: np.ndarray, row_weight: np.ndarray | None = None):
    """`[steps]` packed verify tokens (`bs` + the windows). With `row_weight` (per row, from
    `closed_loop_weights`) each step holds its batch size of the reweighted mix: `bs` times
    its rows' weighted mean window (rounded to 1e-9, so that a step of one workload keeps
    its own tokens and tier)."""
    bs = frame.step_bs.astype(np.float64)
    if row_weight is None:
        return bs + np.add.reduceat(windows, frame.step_start)
    mean = np.add.reduceat(row_weight * windows, frame.step_start)
    mean /= np.add.reduceat(row_weight, frame.step_start)
    return bs + np.round(bs * mean, 9)


def step_seconds(frame: RunFrame, tokens: np.ndarray) -> np.ndarray:
    """`[steps]` predicted step time at `tokens` (`step_tokens`): measured times scaled by
    the table."""
    bs = frame.step_bs.astype(np.float64)
    return repriced_seconds(
        frame.table, bs, tokens, frame.step_tier, frame.step_ms / 1e3, frame.tiers
    )
