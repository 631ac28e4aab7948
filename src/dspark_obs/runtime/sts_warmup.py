"""Fit STS for the runtime's confidence head before a run, as an operator would.

SGLang fits STS offline from confidence logits collected where the whole block
is verified (labels need the full accept chain). The warm-up does the same on
separate traffic (another seed, so the fitted run is held out): a short
cap-accept run, its raw confidence logits and ceilings, one temperature per
position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace

import numpy as np

from ..calibration import StsCalibration, fit_sts, load_sts, prefix_labels
from ..telemetry.batch import StepBatch
from .config import RuntimeConfig
from .factory import make_runtime

WARMUP_SEED_OFFSET = 1_000_003

#: a progress display for the warm-up run: given its configuration, a context yielding a
#: callback for each of its steps (the CLI's bar; none by default)
Progress = Callable[[RuntimeConfig], AbstractContextManager[Callable[[StepBatch], object]]]


@contextmanager
def _no_progress(_: RuntimeConfig) -> Iterator[Callable[[StepBatch], object]]:
    yield lambda batch: None


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
    config: RuntimeConfig,
    steps: int,
    concurrency: int = 32,
    use_shipped: bool = True,
    progress: Progress | None = None,
) -> StsCalibration:
    """STS fitted on the warm-up run (the real world's default one is shipped, fitted at
    build: `real/shipped_sts.py`). `progress` is shown from before the warm-up's networks
    load to its last step, and only when it runs: a real-world warm-up takes minutes."""
    warm = warmup_config(config, steps, concurrency)
    if use_shipped and warm.world_spec.target == "real":
        from .real.shipped_sts import shipped_sts

        shipped = shipped_sts(warm)
        if shipped is not None:
            return shipped
    logits, ceilings, accepted, windows = [], [], [], []
    with (progress or _no_progress)(warm) as advance:
        for batch in make_runtime(warm).run():
            logits.append(batch.confidence_logits)
            ceilings.append(batch.ceiling)
            accepted.append(batch.correct_drafts)
            windows.append(batch.window)
            advance(batch)
    labels, labelled = prefix_labels(
        np.concatenate(accepted), np.concatenate(windows), np.concatenate(ceilings), config.gamma
    )
    return fit_sts(np.concatenate(logits), labels, labelled, dataset="dspark-obs runtime warm-up")


def resolve_sts(
    spec: str, config: RuntimeConfig, warmup_steps: int, progress: Progress | None = None
) -> StsCalibration | None:
    """The calibration a run uses: 'none' (raw confidence), 'auto' (fitted on a warm-up run
    of `warmup_steps`, shown by `progress` while it runs), or an STS JSON file with one
    temperature per position."""
    if spec == "none":
        return None
    if spec == "auto":
        if warmup_steps < 1:
            raise ValueError("--sts-warmup-steps must be >= 1")
        return warmup_sts(config, warmup_steps, progress=progress)
    cal = load_sts(spec)
    if len(cal.temperatures) != config.gamma:
        raise ValueError(f"{spec}: {len(cal.temperatures)} temperatures for gamma={config.gamma}")
    return cal
