"""Prefix labels: what the target said about each drafted position, and where it said nothing.

A confidence head predicts survival, "the first j+1 drafts are all accepted".
Static and cap-accept verification (and a shadow twin) reveal the full-block
ceiling, so every position gets a label. Compact verification only checks the
scheduled window: a rejection inside it settles every later position (the prefix
already broke), but a fully accepted window says nothing past its end. Counting
those positions as failures would teach the head that long prefixes never
survive, so they are left unlabelled instead.
"""

from __future__ import annotations

import numpy as np


def prefix_labels(
    accepted: np.ndarray, window: np.ndarray, ceiling: np.ndarray, gamma: int
) -> tuple[np.ndarray, np.ndarray]:
    """`(labels, labelled)`, both `[n, gamma]` bool, from per-row counts.

    `ceiling >= 0` marks an observed ceiling; `-1` a censored (compact) row.
    """
    accepted = np.asarray(accepted, dtype=np.int64)
    window = np.asarray(window, dtype=np.int64)
    ceiling = np.asarray(ceiling, dtype=np.int64)
    _check(accepted, window, ceiling, gamma)

    observed = ceiling >= 0
    reach = np.where(observed, ceiling, accepted)
    # row r of `prefix` is `j < r` over the positions j: a row's labels are a row of it,
    # gathered (comparing `[n, 1]` with `[1, gamma]` costs numpy a short loop per row)
    prefix = np.arange(gamma)[None, :] < np.arange(gamma + 1)[:, None]
    labels = np.take(prefix, reach, axis=0)
    # A censored row is silent only past a fully accepted window.
    settled = observed | (accepted < window)
    labelled = np.take(prefix, np.where(settled, gamma, accepted), axis=0)
    return labels, labelled


def _check(accepted: np.ndarray, window: np.ndarray, ceiling: np.ndarray, gamma: int) -> None:
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if accepted.ndim != 1 or accepted.shape != window.shape or accepted.shape != ceiling.shape:
        raise ValueError(
            "accepted, window and ceiling must be 1-D of one length, got "
            f"{accepted.shape}, {window.shape}, {ceiling.shape}"
        )
    if (window < 0).any() or (window > gamma).any():
        raise ValueError(f"window outside 0..gamma={gamma}")
    if (accepted < 0).any() or (accepted > window).any():
        raise ValueError("accepted outside 0..window")
    if (ceiling < -1).any() or (ceiling > gamma).any():
        raise ValueError(f"ceiling outside -1..gamma={gamma}")
