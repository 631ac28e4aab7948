"""Fit STS for the runtime's confidence head before a run, as an operator would.

SGLang fits STS offline from confidence logits collected where the whole block
is verified (labels need the full accept chain). The warm-up does the same on
separate traffic (another seed, so the fitted run is held out): a short
cap-accept run, its raw confidence logits and ceilings, one temperature per
position.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..calibration import StsCalibration, fit_sts, load_sts, prefix_labels
from .config import RuntimeConfig
from .factory import make_runtime

WARMUP_SEED_OFFSET = 1_000_003


def warmup_config(config: RuntimeConfig, steps: int, concurrency: int = 32) -> RuntimeConfig:
    """The warm-up run `config`'s calibration is fitted on."""
    return replace(
        config,
        seed=config.seed + WARMUP_SEED_OFFSET,
        mode="cap-accept",
        shadow=None,
        concurrency=[concurrency],
        steps_per_level=steps,
        level_steps=None,
        sts_temperatures=None,
    )


def warmup_sts(
    config: RuntimeConfig, steps: int, concurrency: int = 32, use_shipped: bool = True
) -> StsCalibration:
    """STS fitted on the warm-up run (the real world's default one is shipped, fitted at
    build: `real/shipped_sts.py`)."""
    warm = warmup_config(config, steps, concurrency)
    if use_shipped and warm.world_spec.target == "real":
        from .real.shipped_sts import shipped_sts

        shipped = shipped_sts(warm)
        if shipped is not None:
            return shipped
    logits, ceilings, accepted, windows = [], [], [], []
    for batch in make_runtime(warm).run():
        logits.append(batch.confidence_logits)
        ceilings.append(batch.ceiling)
        accepted.append(batch.correct_drafts)
        windows.append(batch.window)
    labels, labelled = prefix_labels(
        np.concatenate(accepted), np.concatenate(windows), np.concatenate(ceilings), config.gamma
    )
    return fit_sts(np.concatenate(logits), labels, labelled, dataset="dspark-obs runtime warm-up")


def resolve_sts(spec: str, config: RuntimeConfig, warmup_steps: int) -> StsCalibration | None:
    """The calibration a run uses: 'none' (raw confidence), 'auto' (fitted on a warm-up run
    of `warmup_steps`), or an STS JSON file with one temperature per position."""
    if spec == "none":
        return None
    if spec == "auto":
        if warmup_steps < 1:
            raise ValueError("--sts-warmup-steps must be >= 1")
        return warmup_sts(config, warmup_steps)
    cal = load_sts(spec)
    if len(cal.temperatures) != config.gamma:
        raise ValueError(f"{spec}: {len(cal.temperatures)} temperatures for gamma={config.gamma}")
    return cal
