"""The request rows of the steps that one fold takes in, and which fold takes them.

The compiled fold (`_rowfold.c`) reads each step's own columns in place; the numpy
fold (in `tokens.py` and `confidence.py`) needs them joined, one column per field over
all the steps. Each joined column is made on first use, so the compiled fold never
pays for joining.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from .. import extensions
from ..telemetry import StepBatch
from ..telemetry.batch import MODE_CODE, ceiling_rule

#: the fold in C where it was built (and DSPARK_OBS_NO_EXTENSIONS does not switch it off);
#: the numpy fold where not
_rowfold = extensions.load("dspark_obs.aggregates._rowfold")

__all__ = ["MODE_CODE", "RequestRows", "compiled_fold"]


def compiled_fold(compiled: bool | None):
    """The C fold when `compiled` asks for it (None: where it was built), else None."""
    if compiled and _rowfold is None:
        raise RuntimeError("the compiled row fold is not built in this install (or switched off)")
    return _rowfold if compiled is None or compiled else None


class RequestRows:
    def __init__(self, batches: list[StepBatch], group: np.ndarray) -> None:
        """Validated steps with request rows, and the group of each of their rows."""
        self.batches = batches
        self.group = group
        self.modes = [MODE_CODE[b.mode] for b in batches]

    def _joined(self, name: str) -> np.ndarray:
        """A column or vocabulary property (`telemetry.batch.VOCABULARY`) over every step."""
        return np.concatenate([getattr(b, name) for b in self.batches])

    @cached_property
    def window(self) -> np.ndarray:
        return self._joined("window")

    @cached_property
    def accepted(self) -> np.ndarray:
        return self._joined("accepted")

    @cached_property
    def committed(self) -> np.ndarray:
        return self._joined("committed")

    @cached_property
    def shadow(self) -> np.ndarray:
        return self._joined("shadow_ceiling")

    @cached_property
    def ceiling(self) -> np.ndarray:
        """The ceiling each row's mode reveals, -1 where it censors (`ceiling_rule`)."""
        mode = np.repeat(self.modes, [b.num_reqs for b in self.batches])
        return ceiling_rule(mode, self.accepted, self._joined("cap_trim"))

    @cached_property
    def scored(self) -> np.ndarray | slice:
        """The rows of steps with survival (a mask, or every row)."""
        has = [b.survival is not None for b in self.batches]
        return slice(None) if all(has) else np.repeat(has, [b.num_reqs for b in self.batches])

    @cached_property
    def survival(self) -> np.ndarray | None:
        """`[scored rows, gamma]`, None when no step has it."""
        found = [b.survival for b in self.batches if b.survival is not None]
        return np.concatenate(found) if found else None
