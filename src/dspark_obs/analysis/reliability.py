"""Per-position calibration histograms of a stored run, read in windows, binned in one pass.

The live aggregates and `CalibrationAccumulator` bin a step at a time; a stored run of
tens of millions of request-steps is read a window of rows at a time (the matrices only
as plain `[rows, gamma]` arrays) and each window binned the same way, every
(workload, *by) group in one pass: a C loop (`aggregates/_rowfold.c`) where it was
built, bincounts in numpy where not. The result fills the same accumulators, so the
report, the `calibration` command and the live exporter share one reduction (ECE,
Brier, AUROC) and agree exactly on counts; memory follows the window, not the run.

Two predictions can be binned: the recorded survival (what the scheduler used,
after STS when the run had one) and `raw`, the survival of the raw confidence
logits at temperature 1, which is what STS starts from. The fold computes `raw` from
the logits row by row, so no survival matrix is built for it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl

from ..aggregates.rows import compiled_fold
from ..calibration import CalibrationAccumulator, prefix_labels
from ..calibration.metrics import EPS_PROB
from ..domain.workload_codes import workload_code
from ..store import Run, open_run
from ..store.fleet import Fleet, FleetHead

RECORDED = "survival"
RAW = "raw"


def _source(stage: str) -> str:
    return RECORDED if stage == RECORDED else "confidence_logits"


def _sorted_unique(req: pl.LazyFrame, column: str) -> list:
    values = req.select(pl.col(column).unique()).collect()[column].to_list()
    return sorted(values, key=lambda v: (v is None, v if v is not None else ""))


def _group_code(req: pl.LazyFrame, by: tuple[str, ...]) -> tuple[pl.Expr, Callable]:
    """One integer per (workload, *by) present, and the function back to its key.

    Without `by` the key is the workload name (what the report and `calibration`
    have always used); with it, a tuple (workload, value of each `by` column).
    """
    names = _sorted_unique(req, "workload")
    known_names = [n for n in names if n is not None]
    code = workload_code(known_names)
    levels = [(c, _sorted_unique(req, c)) for c in by]
    stride = len(known_names) + 1
    for column, values in levels:
        index = pl.col(column).replace_strict(
            values, list(range(len(values))), return_dtype=pl.Int64
        )
        code = code + index * stride
        stride *= len(values)

    def key(g: int):
        workload_index, rest = g % (len(known_names) + 1), g // (len(known_names) + 1)
        name = known_names[workload_index] if workload_index < len(known_names) else None
        if not by:
            return name
        out = [name]
        for _, values in levels:
            rest, i = divmod(rest, len(values))
            out.append(values[i])
        return tuple(out)

    return code.alias("group"), key


#: Request-steps binned at a time. Each window's matrices are read while the one
#: before it is binned, so two are held at once: at 500k rows a stage's columns take
#: about 30 MB a window, where reading a 10M request-step run whole took over 1 GB.
WINDOW_ROWS = 500_000
#: Rows folded at a time: a fold's temporaries stay below the process's mmap threshold
#: (`allocator.py`), so they are not faulted in afresh for every part of a window.
FOLD_ROWS = 1 << 15


def calibration_histograms(
    run: Run,
    stages: tuple[str, ...] = (RECORDED, RAW),
    bins: int = 15,
    auroc_bins: int = 1024,
    by: tuple[str, ...] = (),
    compiled: bool | None = None,
) -> dict[str, dict]:
    """Per stage, one accumulator per workload (per (workload, *by) key when `by` names
    request columns, e.g. `rank`, `mode`); a stage no row records is left out.

    The rows are read in windows (`WINDOW_ROWS`) and binned as
    `CalibrationAccumulator.update` bins (`_Totals`): grouping tens of millions of
    (position, bin) keys in polars cost more than reading the matrices, and collecting a
    stage whole held all its rows at once. `compiled` picks the fold: the C one
    (`aggregates/_rowfold.c`) where it was built by default, True to insist on it,
    False for numpy's.
    """
    gamma = run.gamma
    req = run.requests()
    group, key_of = _group_code(req, by)
    columns = (
        group.cast(pl.Int64),
        pl.col("correct_drafts").cast(pl.Int64),
        pl.col("window").cast(pl.Int64),
        pl.coalesce("ceiling", "shadow_ceiling").cast(pl.Int64).fill_null(-1).alias("known"),
        *(_source(s) for s in stages),
    )
    kernels = compiled_fold(compiled)
    totals = {stage: _Totals(gamma, bins, auroc_bins, stage == RAW, kernels) for stage in stages}
    recorded = dict.fromkeys(stages, False)  # whether any row has the stage's position 0

    def read(frame: pl.LazyFrame) -> dict[str, np.ndarray]:
        window = frame.select(columns).collect()
        out = {c: window[c].to_numpy() for c in ("group", "correct_drafts", "window", "known")}
        for stage in stages:
            out[stage] = window[_source(stage)].to_numpy()
        return out

    with ThreadPoolExecutor(1, thread_name_prefix="calibration-read") as reader:
        windows = iter(run.scan_windows("requests", WINDOW_ROWS))
        frame = next(windows, None)
        pending = None if frame is None else reader.submit(read, frame)
        while pending is not None:
            window = pending.result()
            frame = next(windows, None)
            pending = None if frame is None else reader.submit(read, frame)
            for stage in stages:
                recorded[stage] |= totals[stage].add(window, stage)
    return {
        stage: dict(
            sorted(((key_of(g), acc) for g, acc in totals[stage].accumulators()), key=_by_key)
        )
        for stage in stages
        if recorded[stage]
    }


#: `CalibrationAccumulator`'s histograms, by what one row of each is binned over.
HISTOGRAMS = {
    "count": "coarse",
    "target_sum": "coarse",
    "pred_sum": "coarse",
    "fine_pos": "fine",
    "fine_neg": "fine",
    "sq_err_sum": "position",
}
#: The float histograms among them (the rest are counts).
FLOAT_SUMS = ("pred_sum", "sq_err_sum")


class _Totals:
    """Every group's histograms of one stage, as `CalibrationAccumulator.update` bins them,
    added up window by window.

    Rows `[group]` of one array per histogram, the accumulators made once, at the end. The
    compiled fold adds each prediction to them as it reads it; numpy's adds a fold's
    bincounts in one add each (the float sums in the order one accumulator per group would
    add them: a group absent from a fold gets 0.0 there, which changes no bit), so the two
    forms' float sums differ in their last bits.
    """

    def __init__(self, gamma: int, bins: int, auroc_bins: int, raw: bool, kernels) -> None:
        """`raw`: the rows hold confidence logits, whose sigmoids' running product is the
        prediction; `kernels`: the compiled row folds, or None for numpy's."""
        self.gamma, self.bins, self.auroc_bins = gamma, bins, auroc_bins
        self.raw, self.kernels = raw, kernels
        width = {"coarse": gamma * bins, "fine": gamma * auroc_bins, "position": gamma}
        self.sums = {
            name: np.zeros((0, width[kind]), np.float64 if name in FLOAT_SUMS else np.int64)
            for name, kind in HISTOGRAMS.items()
        }

    def _grow(self, groups: int) -> None:
        for name, old in self.sums.items():
            if old.shape[0] < groups:
                new = np.zeros((groups, old.shape[1]), old.dtype)
                new[: old.shape[0]] = old
                self.sums[name] = new

    def add(self, window: dict[str, np.ndarray], stage: str) -> bool:
        """Add a window's `stage` predictions to their groups' histograms; returns whether
        any row records position 0. The compiled fold takes the window whole, numpy's a
        fold of `FOLD_ROWS` at a time."""
        if self.kernels is None:
            recorded = False
            for start in range(0, len(window["group"]), FOLD_ROWS):
                part = {k: v[start : start + FOLD_ROWS] for k, v in window.items()}
                recorded |= self._fold(part, stage)
            return recorded
        group = window["group"]
        if not len(group):
            return False
        self._grow(int(group.max()) + 1)
        return self.kernels.histograms(
            *self.sums.values(),
            group,
            window["correct_drafts"],
            window["window"],
            window["known"],
            np.ascontiguousarray(window[stage], dtype=np.float64),
            self.gamma,
            self.bins,
            self.auroc_bins,
            EPS_PROB,
            self.raw,
        )

    def _fold(self, rows: dict[str, np.ndarray], stage: str) -> bool:
        """numpy's form of the compiled fold, over a few rows.

        A position counts where its prediction is recorded and `prefix_labels` labels it.
        Each (cell, bin) is counted with its label in one bincount (`2 * index + label`:
        negatives and positives interleaved), for the coarse bins and the fine ones.
        """
        gamma, bins, auroc_bins = self.gamma, self.bins, self.auroc_bins
        p = rows[stage]
        if self.raw:
            with np.errstate(over="ignore"):  # a logit below about -709 is a sigmoid of 0
                p = np.cumprod(1.0 / (1.0 + np.exp(-p)), axis=1)
        recorded = ~np.isnan(p)
        labels, labelled = prefix_labels(
            rows["correct_drafts"], rows["window"], rows["known"], gamma
        )
        labelled &= recorded
        if not labelled.any():
            return bool(recorded[:, 0].any())
        group = rows["group"]
        # each row's cells gathered from a table (a [n, 1] + [1, gamma] sum loops per row)
        cells_of = np.arange((int(group.max()) + 1) * gamma).reshape(-1, gamma)
        cell = np.take(cells_of, group, axis=0)[labelled]
        labels = labels[labelled]
        probs = np.clip(p[labelled], EPS_PROB, 1.0 - EPS_PROB)
        groups = int(cell.max()) // gamma + 1
        self._grow(groups)
        cells = groups * gamma

        def binned(resolution: int) -> np.ndarray:
            index = (probs * resolution).astype(np.int64)
            np.minimum(index, resolution - 1, out=index)
            index += cell * resolution
            return index

        coarse = binned(bins)
        by_label = np.bincount(2 * coarse + labels, minlength=2 * cells * bins).reshape(-1, 2)
        fine = binned(auroc_bins)
        fine *= 2
        fine += labels
        fine_by_label = np.bincount(fine, minlength=2 * cells * auroc_bins).reshape(-1, 2)
        sums = self.sums
        sums["count"][:groups] += (by_label[:, 0] + by_label[:, 1]).reshape(groups, -1)
        sums["target_sum"][:groups] += by_label[:, 1].reshape(groups, -1)
        sums["pred_sum"][:groups] += np.bincount(coarse, probs, cells * bins).reshape(groups, -1)
        sums["fine_pos"][:groups] += fine_by_label[:, 1].reshape(groups, -1)
        sums["fine_neg"][:groups] += fine_by_label[:, 0].reshape(groups, -1)
        squares = np.bincount(cell, (probs - labels) ** 2, cells)
        sums["sq_err_sum"][:groups] += squares.reshape(groups, -1)
        return bool(recorded[:, 0].any())

    def accumulators(self) -> list[tuple[int, CalibrationAccumulator]]:
        """(group, its accumulator) for every group with a counted position."""
        out = []
        for g in np.flatnonzero(self.sums["count"].any(axis=1)).tolist():
            acc = CalibrationAccumulator(self.gamma, num_bins=self.bins, auroc_bins=self.auroc_bins)
            out.append((g, acc.add_histograms(**{k: v[g] for k, v in self.sums.items()})))
        return out


def _by_key(item: tuple) -> tuple:
    return _order(item[0])


def _order(key) -> tuple:
    """Workloads by name, the unnamed one last; tuples element by element alike."""
    parts = key if isinstance(key, tuple) else (key,)
    return tuple((v is None, v if v is not None else "") for v in parts)


def pooled(accumulators: dict[str | None, CalibrationAccumulator]) -> CalibrationAccumulator:
    """Every workload's histograms in one accumulator."""
    first = next(iter(accumulators.values()))
    total = CalibrationAccumulator(first.gamma, first.num_bins, first.auroc_bins)
    for acc in accumulators.values():
        total.merge(acc)
    return total


def calibration_report(run_dir: Path, bins: int = 15) -> dict:
    """Per workload and overall, one entry per block position: what `calibration` prints."""
    if bins < 1:
        raise ValueError("--bins must be >= 1")
    run = open_run(run_dir)
    per_workload = calibration_histograms(run, (RECORDED,), bins=bins).get(RECORDED)
    if not per_workload:
        raise ValueError(f"{run_dir}: no confidence recorded (SGLang dumps need a confidence head)")
    return {
        "run": str(run_dir),
        "bins": bins,
        "workloads": {name: {"positions": acc.compute()} for name, acc in per_workload.items()},
        "overall": {"positions": pooled(per_workload).compute()},
    }


def run_histograms(
    run: Run, node: str, stages: tuple[str, ...], bins: int, by: tuple[str, ...]
) -> dict[str, dict[tuple, CalibrationAccumulator]]:
    """One run's accumulators per stage and (workload, *by) key: the fleet fold's map
    (`node` is the run's, `rank` and `mode` the rows')."""
    row_keys = tuple(k for k in by if k != "node")
    out: dict[str, dict[tuple, CalibrationAccumulator]] = {}
    for stage, hist in calibration_histograms(run, stages, bins=bins, by=row_keys).items():
        groups = out.setdefault(stage, {})
        for key, acc in hist.items():
            values = dict(zip(row_keys, key[1:], strict=True)) if row_keys else {}
            values["node"] = node
            groups[(key[0] if row_keys else key, *(values[k] for k in by))] = acc
    return out


def add_histograms(
    parts: list[dict[str, dict[tuple, CalibrationAccumulator]]], stages: tuple[str, ...]
) -> dict[str, dict[tuple, CalibrationAccumulator]]:
    """The runs' accumulators (`run_histograms`) added per stage and key: the fold's reduce."""
    out: dict[str, dict[tuple, CalibrationAccumulator]] = {}
    for part in parts:
        for stage, hist in part.items():
            groups = out.setdefault(stage, {})
            for key, acc in hist.items():
                if key in groups:
                    groups[key].merge(acc)
                else:
                    groups[key] = acc
    return {stage: out[stage] for stage in stages if stage in out}


def per_workload(groups: dict[tuple, CalibrationAccumulator]) -> dict:
    """The (workload, *by) accumulators pooled per workload, workloads in report order."""
    out: dict[str | None, CalibrationAccumulator] = {}
    for key, acc in groups.items():
        out.setdefault(key[0], CalibrationAccumulator(acc.gamma, acc.num_bins, acc.auroc_bins))
        out[key[0]].merge(acc)
    return dict(sorted(out.items(), key=lambda kv: _order(kv[0])))


def group_entries(groups: dict[tuple, CalibrationAccumulator], by: tuple[str, ...]) -> list:
    """One entry per (workload, *by) key: the keys and the positions' figures."""
    if not by:
        return []
    return [
        {**dict(zip(by, key[1:], strict=True)), "workload": key[0], "positions": acc.compute()}
        for key, acc in sorted(groups.items(), key=lambda kv: _order(kv[0][1:] + kv[0][:1]))
    ]


def fleet_calibration_report(fleet: Fleet, bins: int = 15, by: tuple[str, ...] = ()) -> dict:
    """`calibration_report` of many runs taken together (each run's `run_histograms`,
    added): ECE, Brier and AUROC computed once from the added histograms."""
    if bins < 1:
        raise ValueError("--bins must be >= 1")
    runs = zip(fleet.runs, fleet.nodes, strict=True)
    parts = [run_histograms(r, n, (RECORDED,), bins, by) for r, n in runs]
    return calibration_of_histograms(fleet.head, parts, bins, by)


def calibration_of_histograms(
    head: FleetHead, parts: list[dict], bins: int, by: tuple[str, ...] = ()
) -> dict:
    """`fleet_calibration_report` from its runs' `run_histograms`, wherever they were binned."""
    groups = add_histograms(parts, (RECORDED,)).get(RECORDED)
    if not groups:
        raise ValueError("no run of the fleet recorded confidence (SGLang dumps need a head)")
    workloads = per_workload(groups)
    return {
        "run": head.run,
        "runs": head.describe(),
        "bins": bins,
        "by": list(by),
        "workloads": {name: {"positions": acc.compute()} for name, acc in workloads.items()},
        "overall": {"positions": pooled(workloads).compute()},
        "groups": group_entries(groups, by),
    }
