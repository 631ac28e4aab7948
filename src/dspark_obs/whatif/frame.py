"""The arrays a prediction reads: a run's request-steps grouped by step, and their cells.

`frame_loader.load_run_frame` builds a `RunFrame` from a run directory; every other
module of the prediction reads it (numpy arrays, one row per request-step or per step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..domain.cost_table import AdditiveCostTable
from .counterfactual_accept import AcceptInputs


@dataclass
class CellCodes:
    """Each request-step's cell as integers, so that a policy's cells are `np.bincount`s.

    `cell` is `level_code * len(workloads) + group`; `pair` a dense code of (level,
    request), the clusters of the interval's cluster-robust part; `part` a dense code of
    (step, workload), the rows that share a step time and a cell, over which the
    interval's row-level spread is summed (about 80 times fewer than the rows of a 10M
    request-step run).
    The pairs and parts serve the intervals and the closed loop alone: a frame loaded
    without `clusters` (`load_run_frame`) holds None there.
    """

    levels: np.ndarray  # the level of each level code
    workloads: list  # the name of each workload code (None: rows without one)
    cell: np.ndarray  # [rows] (level, workload) code
    step_level: np.ndarray  # [steps] level code
    cell_rows: np.ndarray  # [cells] request-steps, as float64
    cell_steps: np.ndarray  # [cells] distinct steps holding the cell's rows
    level_steps: np.ndarray  # [levels] steps
    pair: np.ndarray | None = None  # [rows] (level, request) code
    pair_cell: np.ndarray | None = None  # [pairs] the pair's (level, workload) code
    pair_level: np.ndarray | None = None  # [pairs] the pair's level code
    part: np.ndarray | None = None  # [rows] (step, workload) code
    part_step: np.ndarray | None = None  # [parts] the part's step
    part_cell: np.ndarray | None = None  # [parts] the part's (level, workload) code
    part_rows: np.ndarray | None = None  # [parts] its request-steps, as float64
    pair_rows: np.ndarray | None = None  # [pairs] request-steps, as float64
    pair_inside: np.ndarray | None = (
        None  # [pairs] the request began and ended in the level's stretch
    )


@dataclass
class RunFrame:
    """A run's request-steps, grouped by step, as the predictions read them."""

    gamma: int
    step: np.ndarray  # [rows] the row's step (index into the step arrays)
    cells: CellCodes
    inputs: AcceptInputs
    survival: np.ndarray | None
    logits: np.ndarray | None
    step_start: np.ndarray
    step_bs: np.ndarray
    step_ms: np.ndarray  # measured, NaN where untimed
    step_tier: np.ndarray  # the recorded verify tokens (its captured tier)
    table: AdditiveCostTable
    table_source: str
    tiers: tuple[int, ...]
    ceiling_sources: dict
    own_committed: np.ndarray | None = None  # [pairs] the run's committed tokens
    #: [rows] under a confidence relay, the row whose survival each row's budget is planned
    #: on (-1: survival 1); None without a relay (`relay.relay_rows`)
    relay_row: np.ndarray | None = None
    #: [rows] the same one step back, whatever the run's relay (the `topk` policy's); None
    #: where no such policy was asked for
    last_step_row: np.ndarray | None = None
