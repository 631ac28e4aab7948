"""Sequential temperature scaling (STS), fitted and stored exactly as SGLang does it.

The scheduler ranks positions by survival, a running product of per-position
confidences, so an error at position j compounds into every later one. STS
therefore fits one temperature per position in order, each on top of the
already-fitted survival of the positions before it, choosing from a fixed
log-spaced grid the temperature whose running survival has the lowest ECE.
The result is SGLang's `DSparkStsCalibration` JSON, so a file fitted here loads
into a real server (and one fitted there loads here).
"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import numpy as np

from ..json_files import load_json_file
from ..outputs import write_file
from .metrics import ece_rows

#: SGLang's grid: 41 log-spaced temperatures from 0.1 to 10 (1.0 is on it, index 20).
TEMPERATURE_GRID = np.logspace(-1, 1, 41)
TEMPERATURE_GRID.setflags(write=False)


class StsCalibration(msgspec.Struct, frozen=True, omit_defaults=True):
    temperatures: list[float]
    dataset: str = ""
    num_samples: int = 0
    ece_before: list[float] = []
    ece_after: list[float] = []

    def __post_init__(self) -> None:
        if not self.temperatures:
            raise ValueError("STS calibration needs at least one temperature")
        if not all(math.isfinite(t) and t > 0 for t in self.temperatures):
            raise ValueError(f"STS temperatures must be finite and > 0, got {self.temperatures}")
        if self.num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {self.num_samples}")
        for name in ("ece_before", "ece_after"):
            values = getattr(self, name)
            if values and len(values) != len(self.temperatures):
                raise ValueError(
                    f"{name} has {len(values)} entries for {len(self.temperatures)} positions"
                )
            if not all(math.isfinite(v) and v >= 0 for v in values):
                raise ValueError(f"{name} must be finite and >= 0, got {values}")


def save_sts(cal: StsCalibration, path: str | Path) -> None:
    write_file(path, msgspec.json.encode(cal))


def load_sts(path: str | Path) -> StsCalibration:
    """The calibration in `path`; any problem is a ValueError that names the file."""
    return load_json_file(path, StsCalibration, "STS calibration")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # torch's form, so fits match SGLang's to the last bit where possible;
    # exp overflow for very negative x correctly gives 0.
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def apply_sts(
    logits: np.ndarray, temperatures: list[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`(confidence, survival)`, both `[n, gamma]`: what the scheduler would see."""
    logits = np.asarray(logits, dtype=np.float64)
    temps = np.asarray(temperatures, dtype=np.float64)
    if logits.ndim != 2 or temps.shape != (logits.shape[1],):
        raise ValueError(
            f"logits {logits.shape} need one temperature per column, got {temps.shape}"
        )
    if not (np.isfinite(temps) & (temps > 0)).all():
        raise ValueError("temperatures must be finite and > 0")
    confidence = _sigmoid(logits / temps)
    return confidence, np.cumprod(confidence, axis=1)


def fit_sts(
    logits: np.ndarray,
    labels: np.ndarray,
    labelled: np.ndarray | None = None,
    num_bins: int = 15,
    dataset: str = "",
    grid: np.ndarray | None = None,
) -> StsCalibration:
    """Fit one temperature per position; unlabelled entries are left out of that position's ECE.

    Every row still carries its running survival through all positions, so a
    row unlabelled at j keeps contributing where it is labelled later. A
    position with no labelled row at all cannot be fitted and raises.
    """
    logits, targets, labelled = _fit_inputs(logits, labels, labelled)
    grid = TEMPERATURE_GRID if grid is None else np.asarray(grid, dtype=np.float64)
    n, gamma = logits.shape

    at_one = np.ones(n)
    fitted = np.ones(n)
    temperatures: list[float] = []
    ece_before: list[float] = []
    ece_after: list[float] = []
    for j in range(gamma):
        rows = labelled[:, j]
        if not rows.any():
            raise ValueError(f"cannot fit STS position {j}: no labelled rows")
        x, y = logits[:, j], targets[rows, j]
        at_one = at_one * _sigmoid(x)
        ece_before.append(float(ece_rows(at_one[rows][None, :], y, num_bins)[0]))
        candidates = fitted[rows][None, :] * _sigmoid(x[rows][None, :] / grid[:, None])
        eces = ece_rows(candidates, y, num_bins)
        best = int(np.argmin(eces))  # first minimum: ties keep the smallest temperature
        temperatures.append(float(grid[best]))
        ece_after.append(float(eces[best]))
        fitted = fitted * _sigmoid(x / grid[best])

    return StsCalibration(
        temperatures=temperatures,
        dataset=dataset,
        num_samples=n,
        ece_before=ece_before,
        ece_after=ece_after,
    )


def _fit_inputs(
    logits: np.ndarray, labels: np.ndarray, labelled: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2 or logits.shape[0] == 0 or logits.shape[1] == 0:
        raise ValueError(f"fit_sts needs logits [n > 0, gamma > 0], got {logits.shape}")
    if np.isnan(logits).any():
        raise ValueError("fit_sts: logits contain NaN")
    labels = np.asarray(labels)
    if labels.shape != logits.shape:
        raise ValueError(f"labels shape {labels.shape} != logits shape {logits.shape}")
    if labels.dtype != np.bool_ and not np.isin(labels, (0, 1)).all():
        raise ValueError("labels must be 0/1")
    if labelled is None:
        labelled = np.ones(logits.shape, dtype=bool)
    labelled = np.asarray(labelled, dtype=bool)
    if labelled.shape != logits.shape:
        raise ValueError(f"labelled shape {labelled.shape} != logits shape {logits.shape}")
    return logits, labels.astype(np.float64), labelled
