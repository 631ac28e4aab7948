"""What produced a run: recorded in every manifest so a run can be judged later."""

from __future__ import annotations

import platform

import numpy as np
import polars as pl

from .. import __version__


def versions() -> dict:
    return {
        "dspark_obs": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "polars": pl.__version__,
    }
