"""Each request-step's cell as integer codes, so that a policy's cells are `np.bincount`s.

A cell is (load level, workload); its (level, request) pairs are the clusters of the
rates' intervals and the closed loop's unit, its (step, workload) parts the rows that
share a step time, over which the intervals' row-level spread is summed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..analysis.request_codes import dense_codes
from .frame import CellCodes

#: Steps before a step whose largest level decides its stretch of a level (`_inside`).
STRETCH_SLACK = 32


def cell_codes(
    step_values: np.ndarray, group: np.ndarray, rid, step: np.ndarray, names: list
) -> CellCodes:
    """The cells from each step's level (`step_values`) and each row's workload code,
    request code and step, all by integer tables (no sort of the rows); without `rid`
    (None) the cells alone, no pairs or parts."""
    levels, step_level = np.unique(step_values, return_inverse=True)
    level = step_level[step]
    n_wl, n_cells = len(names), len(levels) * len(names)
    cell = level * n_wl + group
    # a cell's steps: the distinct (step, workload) pairs of its rows, its parts
    key = step * n_wl + group
    seen = np.zeros(len(step_level) * n_wl, bool)
    seen[key] = True
    held = np.flatnonzero(seen)
    part_cell = step_level[held // n_wl] * n_wl + held % n_wl
    cells = CellCodes(
        levels=levels,
        workloads=names,
        cell=cell,
        step_level=step_level,
        cell_rows=np.bincount(cell, minlength=n_cells).astype(np.float64),
        cell_steps=np.bincount(part_cell, minlength=n_cells),
        level_steps=np.bincount(step_level, minlength=len(levels)),
    )
    if rid is None:
        return cells
    pair, n_pairs = dense_codes(level * (int(rid.max()) + 1) + rid)
    pair_cell = np.zeros(n_pairs, np.int64)
    pair_cell[pair] = cell
    part = (np.cumsum(seen) - 1)[key]
    return dataclasses.replace(
        cells,
        pair=pair,
        pair_cell=pair_cell,
        pair_level=pair_cell // n_wl,
        part=part,
        part_step=held // n_wl,
        part_cell=part_cell,
        part_rows=np.bincount(part, minlength=len(held)).astype(np.float64),
        pair_rows=np.bincount(pair, minlength=n_pairs).astype(np.float64),
        pair_inside=np.bincount(pair, _inside(step_level, rid, step), minlength=n_pairs) > 0,
    )


def _inside(step_level: np.ndarray, rid: np.ndarray, step: np.ndarray) -> np.ndarray:
    """`[rows]` whether the row's request began and ended within its level's stretch of
    steps (a request cut by the stretch's end, or carried in from before it, is not): the
    requests the closed loop's steady state describes.
    Where levels are bands of batch sizes, a stretch is that of the band the batch holds
    when it is full, so the requests of a batch that dips into the band below are the
    stretch's too."""
    first = np.full(int(rid.max()) + 1, len(step_level), np.int64)
    last = np.full(int(rid.max()) + 1, -1, np.int64)
    np.minimum.at(first, rid, step)
    np.maximum.at(last, rid, step)
    # a stretch is where the last steps' largest level holds: a batch that dips below its
    # level for a few steps (retracted requests) stays in its stretch
    pad = np.pad(step_level, (STRETCH_SLACK, 0), mode="edge")
    held = np.lib.stride_tricks.sliding_window_view(pad, STRETCH_SLACK + 1).max(axis=1)
    edge = np.flatnonzero(np.diff(held)) + 1
    bounds = np.concatenate(([0], edge, [len(step_level)]))
    stretch = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    begin, end = bounds[:-1][stretch], bounds[1:][stretch] - 1
    return (first[rid] >= begin[step]) & (last[rid] < end[step])
