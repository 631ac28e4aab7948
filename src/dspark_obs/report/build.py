"""`dspark-obs report`: every view of one or more runs, analysed once, written three ways.

Each run is an *arm*. The analyses (`dspark_obs.analysis`, the estimator's
evaluation, the cost fit) run per arm on the lazy Parquet tables; the figures
overlay arms where the axes are shared (load curves, per-workload bars) and
repeat per arm where they are not (reliability, cost, drill-down). What a run
cannot support (no shadow, no logits, no step times, no sweep) becomes a
`missing` line naming what is absent and how to record it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import polars as pl

from ..analysis.cost_fit import CostFit, CostFitError, fit_cost_table
from ..analysis.load import load_curve
from ..analysis.reliability import RAW, RECORDED, calibration_histograms, pooled
from ..analysis.summary import summarize
from ..analysis.trim_loss import (
    request_steps_with_ceiling,
    request_traces,
    top_requests,
    trimmed_with_ceiling,
)
from ..analysis.verify_lengths import window_shares
from ..calibration import CalibrationAccumulator
from ..estimator.evaluate import evaluate, walked_blocks
from ..plotting import save_png
from ..store import Run, open_run
from ..strict_json import clean_json
from .document import Figure, Section, Table, fmt, html_page, markdown
from .figures import calibration as calibration_fig
from .figures import cost as cost_fig
from .figures import estimator as estimator_fig
from .figures import load as load_fig
from .figures import requests as requests_fig
from .figures import workloads as workloads_fig

#: Sections whose tables `report` also prints in the terminal.
TERMINAL_SECTIONS = ("workloads", "load", "estimator", "cost", "requests")

#: Request-steps from which figures render in a worker process (see `FigureQueue`).
BACKGROUND_FIGURES_ROWS = 2_000_000

#: Requests whose step-by-step windows are drawn in the drill-down.
TRACED_REQUESTS = 4

NO_TIMES = (
    "no step times (step_gpu_ms / step_cpu_ms): SGLang records them with the "
    "step_gpu_time or step_cpu_time dump components (SGLANG_DSPARK_ENABLE_SPS_RECORD=1)"
)
NO_CEILING = (
    "no observed ceiling: a compact run shows it only with a cap-accept shadow "
    "(`dspark-obs shadow`, or `run --shadow cap-accept`); the estimator section estimates it"
)
NO_CONFIDENCE = (
    "no confidence recorded: the drafter has no confidence head, or `reqs` was not dumped"
)
NO_RAW = (
    "no raw confidence logits, so no before-STS view: SGLang saves them with "
    "SGLANG_DSPARK_STS_COLLECT_PATH; the reference runtime records them always"
)


@dataclass
class Arm:
    """One run's analyses; fields are None where the run cannot support the view."""

    label: str
    run: Run
    gamma: int
    summary: dict
    shares: pl.DataFrame
    load: pl.DataFrame
    estimate: dict | None
    calibration: dict[str, dict[str | None, CalibrationAccumulator]]
    cost: CostFit | None
    cost_missing: str | None
    top: pl.DataFrame | None
    traces: pl.DataFrame | None
    notes: list[str] = field(default_factory=list)


def _has_requests(run: Run) -> bool:
    return "requests" in run.tables()


def arm_labels(paths: list[Path]) -> list[str]:
    """Short, unique labels: the directory name, with its parent where names collide."""
    names = [p.resolve().name for p in paths]
    labels = []
    for p, name in zip(paths, names, strict=True):
        label = name if names.count(name) == 1 else f"{p.resolve().parent.name}/{name}"
        while label in labels:
            label += "'"
        labels.append(label)
    return labels


def analyse(label: str, run: Run, top: int) -> Arm:
    """The light analyses of one run; `estimate` and `calibration` are filled in later.

    The heavy passes (the estimator's evaluation, calibration histograms) run
    after the light views' figures are queued, so that a large run's figures
    render in the figure worker while those passes run here.
    """
    gamma = int(run.manifest["gamma"])
    if not _has_requests(run):
        raise ValueError(
            f"{run.path}: no request-steps (a block-accept-only ingest); "
            "`dspark-obs estimate` reads those"
        )
    try:
        cost, cost_missing = fit_cost_table(run), None
    except CostFitError as exc:
        cost, cost_missing = None, str(exc)
    rows = request_steps_with_ceiling(run, walked_blocks(run))
    known = trimmed_with_ceiling(rows, gamma) > 0
    best = top_requests(rows, top) if known else None
    traces = None
    if best is not None:
        traces = request_traces(rows, best["rid"].head(TRACED_REQUESTS).to_list())
    return Arm(
        label=label,
        run=run,
        gamma=gamma,
        summary=summarize(run),
        shares=window_shares(run.requests(), gamma),
        load=load_curve(run),
        estimate=None,
        calibration={},
        cost=cost,
        cost_missing=cost_missing,
        top=best,
        traces=traces,
    )


def _render(make: Callable, args: tuple, path: Path) -> None:
    save_png(make(*args), path)


class FigureQueue:
    """Names figure files and renders them, inline or in one worker process.

    Drawing is single-threaded Python while the polars passes leave a core idle
    between their parallel phases, so for a large run the figures of finished
    views render in a separate process (spawned: polars' thread pool does not
    survive a fork) while the next analysis runs. Small runs render inline,
    where starting a process would cost more than it saves. A worker that cannot
    start (a caller whose main module cannot be re-imported, such as stdin) or
    dies costs only speed: its unfinished figures are drawn inline.
    """

    def __init__(self, out: Path, background: bool) -> None:
        self.out = out
        self.counts: dict[int, int] = {}
        self.pool = (
            ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
            if background
            else None
        )
        self.jobs: list[tuple[Callable, tuple, Path, Future | None]] = []

    def save(self, section: int, make: Callable, args: tuple, stem: str, caption: str) -> Figure:
        """Queue `make(*args)`; files are numbered by section, so they sort in page order."""
        k = self.counts[section] = self.counts.get(section, 0) + 1
        path = self.out / f"{section}.{k:02d}-{stem}.png"
        future = None
        if self.pool is not None:
            try:
                future = self.pool.submit(_render, make, args, path)
            except BrokenProcessPool:
                self.pool = None
        if future is None:
            _render(make, args, path)
        self.jobs.append((make, args, path, future))
        return Figure(path, caption)

    def close(self) -> None:
        """Wait for every queued figure; one the worker could not draw is drawn here."""
        for make, args, path, future in self.jobs:
            if future is None:
                continue
            try:
                future.result()
            except BrokenProcessPool:
                _render(make, args, path)
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in label)


def _arm_figures(
    w: FigureQueue, section: int, label: str, args: tuple, figures: list[tuple[Callable, str, str]]
) -> list[Figure]:
    """Queue `(make, stem, caption)` figures of one arm over the same arguments.

    The arm's label goes into every file stem and caption, so the views that
    repeat per arm neither overwrite each other's files nor read ambiguously.
    """
    return [
        w.save(section, make, args, f"{stem}-{_slug(label)}", f"{label}: {caption}")
        for make, stem, caption in figures
    ]


Cell = Callable[[dict], str]


def _num(key: str, digits: int = 3) -> Cell:
    return lambda r: fmt(r[key], digits)


def _name(key: str) -> Cell:
    return lambda r: r[key] or "(none)"


def _rows_table(
    title: str, columns: dict[str, Cell], rows: Iterable[dict], note: str = ""
) -> Table:
    """A table of one row per record, from `{header: cell}`.

    Each header sits beside the cell that fills it, so a column added or moved
    cannot drift out of line with its values.
    """
    return Table(title, list(columns), [[cell(r) for cell in columns.values()] for r in rows], note)


# -- sections ------------------------------------------------------------------------------


def _workload_rows(arm: Arm) -> list[dict]:
    rows = []
    est = (arm.estimate or {}).get("workloads", {})
    for name, entry in arm.summary["workloads"].items():
        e = est.get(name, {})
        walk = e.get("all_steps") or {}
        rows.append(
            {
                "workload": name,
                **entry,
                "estimated_ceiling": walk.get("point"),
                "estimated_lo": walk.get("lo"),
                "estimated_hi": walk.get("hi"),
                "population_ceiling": (e.get("population") or {}).get("mean"),
            }
        )
    return rows


_WORKLOAD_COLUMNS: dict[str, Cell] = {
    "workload": _name("workload"),
    "request-steps": _num("request_steps"),
    "window": _num("mean_window"),
    "accepted": _num("mean_accepted"),
    "committed": _num("mean_committed"),
    "ceiling (observed)": _num("mean_ceiling"),
    "ceiling (walk) [lo, hi]": lambda r: (
        f"{fmt(r['estimated_ceiling'])} [{fmt(r['estimated_lo'])}, {fmt(r['estimated_hi'])}]"
    ),
    "ceiling (population)": _num("population_ceiling"),
    "utilisation": _num("utilisation"),
    "trimmed tokens": _num("trimmed_tokens"),
}


def workloads_section(arms: list[Arm], w: FigureQueue) -> Section:
    s = Section(
        "workloads",
        "Per workload",
        "Mean drafted tokens per request-step: the scheduled window, what the target accepted "
        "in it, and the ceiling (what full verification would have accepted), observed where "
        "the run shows it and estimated from the tail walks (point and [lo, hi] bracket over all "
        "request-steps) and from the population model. Utilisation = accepted / ceiling over "
        "rows with a known ceiling.",
    )
    for arm in arms:
        s.tables.append(
            _rows_table(
                f"{arm.label}: per workload",
                _WORKLOAD_COLUMNS,
                _workload_rows(arm),
                f"observed ceiling source: {arm.summary['overall']['ceiling_source'] or 'none'}",
            )
        )
        if arm.summary["overall"]["ceiling_source"] is None:
            s.missing.append(f"{arm.label}: {NO_CEILING}")
        gamma = arm.gamma
        share_rows = []
        for (name,), part in arm.shares.group_by("workload", maintain_order=True):
            share_rows.append([name or "(none)", *(fmt(v, 4) for v in part["share"].to_list())])
        s.tables.append(
            Table(
                f"{arm.label}: share of request-steps at each verify window",
                ["workload", *(str(k) for k in range(gamma + 1))],
                share_rows,
            )
        )
    gamma = max(a.gamma for a in arms)
    s.figures.append(
        w.save(
            1,
            workloads_fig.workload_figure,
            ([(a.label, _workload_rows(a)) for a in arms], gamma),
            "workloads",
            "Window, accepted and ceiling per workload",
        )
    )
    s.figures.append(
        w.save(
            1,
            workloads_fig.window_share_figure,
            ([(a.label, a.shares) for a in arms], gamma),
            "verify-windows",
            "Distribution of verify windows per workload",
        )
    )
    return s


_LOAD_COLUMNS: dict[str, Cell] = {
    "bs": _num("bs"),
    "steps": _num("steps"),
    "budget/request": _num("budget_per_request"),
    "verify tokens/step": _num("verify_tokens_per_step", 1),
    "step ms": _num("mean_step_ms", 2),
    "throughput tok/s": _num("throughput_tokens_per_s", 0),
    "per-user tok/s": _num("per_user_tokens_per_s", 1),
}


def load_section(arms: list[Arm], w: FigureQueue) -> Section:
    s = Section(
        "load",
        "Load",
        "Per load level (batch size): the scheduler's verify budget per request, verify tokens "
        "per step, step time, total throughput (summed over data-parallel ranks) and per-user "
        "decode speed (committed tokens over the step time each request sat through).",
    )
    for arm in arms:
        s.tables.append(
            _rows_table(f"{arm.label}: load levels", _LOAD_COLUMNS, arm.load.iter_rows(named=True))
        )
        if arm.load["throughput_tokens_per_s"].is_null().all():
            s.missing.append(f"{arm.label}: {NO_TIMES}")
        if arm.load.height < 2:
            s.missing.append(
                f"{arm.label}: a single load level, so no sweep to draw "
                "(run a concurrency sweep, e.g. `run --concurrency 1,8,32,64,128,256`)"
            )
    arms_load = [(a.label, a.load) for a in arms]
    if any(f.filter(pl.col("throughput_tokens_per_s").is_not_null()).height for _, f in arms_load):
        s.figures.append(
            w.save(
                2,
                load_fig.throughput_figure,
                (arms_load,),
                "throughput",
                "Throughput vs per-user speed",
            )
        )
        s.figures.append(
            w.save(2, load_fig.step_time_figure, (arms_load,), "step-time", "Step time vs bs")
        )
    if any(f["budget_per_request"].is_not_null().any() for _, f in arms_load):
        s.figures.append(
            w.save(2, load_fig.budget_figure, (arms_load,), "budget", "Budget per request vs bs")
        )
    return s


def calibration_section(arms: list[Arm], w: FigureQueue) -> Section:
    s = Section(
        "calibration",
        "Calibration",
        "Per block position j: does predicted survival match the observed rate of 'the first "
        "j+1 drafts were accepted'? ECE over 15 equal-width bins, Brier score, AUROC from a "
        "1,024-bin histogram (SGLang's binning); rows a compact window leaves unsettled are "
        "not labelled.",
    )
    for arm in arms:
        if not arm.calibration:
            s.missing.append(f"{arm.label}: {NO_CONFIDENCE}")
            continue
        if RAW not in arm.calibration:
            s.missing.append(f"{arm.label}: {NO_RAW}")
        stages = {stage: pooled(hist) for stage, hist in arm.calibration.items()}
        metrics = {stage: acc.compute() for stage, acc in stages.items()}
        columns = ["position", "rows"]
        for stage in stages:
            tag = "after" if stage == RECORDED else "before"
            columns += [f"ECE {tag}", f"Brier {tag}", f"AUROC {tag}"]
        columns += ["predicted (after)", "observed"]
        rows = []
        for j in range(arm.gamma):
            row = [str(j), fmt(metrics[RECORDED][j]["count"]) if RECORDED in metrics else "—"]
            for stage in stages:
                m = metrics[stage][j]
                row += [fmt(m["ece"], 4), fmt(m["brier"], 4), fmt(m["auroc"], 4)]
            first = metrics[RECORDED][j] if RECORDED in metrics else metrics[RAW][j]
            row += [fmt(first["pred_mean"], 4), fmt(first["target_mean"], 4)]
            rows.append(row)
        note = "after: the survival the scheduler used; before: raw confidence at temperature 1"
        if arm.run.manifest.get("sts") is None:
            note += " (this run had no STS, so both are the raw confidence)"
        s.tables.append(Table(f"{arm.label}: calibration per position", columns, rows, note))
        s.figures += _arm_figures(
            w,
            3,
            arm.label,
            (arm.label, stages),
            [
                (calibration_fig.reliability_figure, "reliability", "reliability per position"),
                (calibration_fig.ece_figure, "ece", "ECE per position"),
            ],
        )
    return s


def cost_quality_table(fit: CostFit, title: str) -> Table:
    """How well the refitted table and the run's own table predict the measured steps."""
    rows = []
    for name, e in (("refitted table", fit.fitted), ("run's own table", fit.own)):
        if e is None:
            continue
        rows.append(
            [
                name,
                fmt(e.steps),
                fmt(e.r2, 4),
                fmt(e.rms_seconds * 1e3, 3),
                fmt(e.rel_error_median, 4),
                fmt(e.rel_error_mean, 4),
                fmt(e.bias_seconds * 1e3, 3),
            ]
        )
    columns = ["table", "steps", "R²", "RMS ms", "median rel. error", "mean rel. error"]
    return Table(
        title,
        [*columns, "bias ms"],
        rows,
        f"{fit.cells:,} (bs, M/64) cells; measured time: {fit.time_column}; bias = mean of "
        "measured - predicted",
    )


def cost_section(arms: list[Arm], w: FigureQueue) -> Section:
    s = Section(
        "cost",
        "Step-cost model",
        "The additive table T(bs, K) = bias + alpha(bs) + theta(bs + K) refitted from the "
        "measured step times (SGLang's OLS over (bs, M/64) cells), against the table the run "
        "used. `dspark-obs cost fit RUN --out table.json` writes the refitted table.",
    )
    for arm in arms:
        fit = arm.cost
        if fit is None:
            s.missing.append(f"{arm.label}: {arm.cost_missing}")
            continue
        s.tables.append(cost_quality_table(fit, f"{arm.label}: predicted vs measured step time"))
        s.figures += _arm_figures(
            w,
            4,
            arm.label,
            (fit,),
            [
                (cost_fig.surface_figure, "cost-surface", "cell means and the fitted table"),
                (cost_fig.scatter_figure, "cost-scatter", "predicted vs measured step time"),
                (cost_fig.residual_figure, "cost-residuals", "residuals of the fitted table"),
            ],
        )
    return s


def estimator_section(arms: list[Arm], w: FigureQueue) -> Section:
    s = Section(
        "estimator",
        "Ceiling estimator",
        "Trimmed blocks (window fully accepted, shorter than the block) hide their ceiling. The "
        "tail walks recover it from later steps; the population model from (window, accepted, "
        "confidence). Where a cap-accept shadow ran, its ceiling is the truth: error is the "
        "walk point's relative error on the walked blocks, covered whether the truth lies in the "
        "aggregate interval.",
    )
    for arm in arms:
        report = arm.estimate
        if not report or not report["workloads"]:
            s.missing.append(f"{arm.label}: nothing to estimate")
            continue
        rows = []
        no_truth = True
        for name, e in report["workloads"].items():
            c = e["counts"]
            for method in ("greedy", "sampled"):
                m = e[method]
                if not m.get("blocks"):
                    continue
                no_truth = no_truth and m.get("truth") is None
                rows.append(
                    [
                        name or "(none)",
                        f"{method} walk",
                        fmt(m["blocks"]),
                        fmt(m["censored_rate"], 4),
                        fmt(m.get("truth")),
                        fmt(m["lo"]),
                        fmt(m["point"]),
                        fmt(m["hi"]),
                        fmt(None if m.get("error") is None else 100 * m["error"], 2),
                        fmt(m.get("covered")) if "covered" in m else "—",
                    ]
                )
            pop = e.get("population") or {}
            truth = e.get("truth")
            rows.append(
                [
                    name or "(none)",
                    "population",
                    fmt(c["blocks"]),
                    fmt(c["censored"] / c["walked"] if c.get("walked") else None, 4),
                    fmt(truth),
                    "",
                    fmt(pop.get("mean")),
                    "",
                    fmt(100 * (pop["mean"] / truth - 1) if truth and pop else None, 2),
                    "",
                ]
            )
        s.tables.append(
            Table(
                f"{arm.label}: estimated vs true ceiling",
                [
                    "workload",
                    "method",
                    "blocks",
                    "censored share",
                    "truth",
                    "lo",
                    "point",
                    "hi",
                    "error %",
                    "covered",
                ],
                rows,
                "walk rows: trimmed blocks only; censored share: walks that ran out of evidence",
            )
        )
        if no_truth:
            s.missing.append(
                f"{arm.label}: no shadow truth, so estimates are shown without errors "
                "(run a cap-accept twin: `dspark-obs shadow` or `run --shadow cap-accept`)"
            )
        s.figures += _arm_figures(
            w,
            5,
            arm.label,
            (arm.label, report),
            [
                (estimator_fig.estimates_figure, "estimates", "estimated vs true ceiling"),
                (estimator_fig.survival_figure, "survival", "survival of the ceiling"),
            ],
        )
    return s


_REQUEST_COLUMNS: dict[str, Cell] = {
    "rid": lambda r: r["rid"],
    "workload": _name("workload"),
    "steps": _num("steps"),
    "committed": _num("committed"),
    "window": _num("mean_window", 2),
    "accepted": _num("mean_accepted", 2),
    "ceiling (known rows)": _num("mean_ceiling", 2),
    "trim loss": _num("trim_loss", 1),
    "loss share": _num("loss_share", 3),
    "unknown steps": _num("unknown_steps"),
}


def requests_section(arms: list[Arm], w: FigureQueue, top: int) -> Section:
    s = Section(
        "requests",
        "Requests that lost the most to trimming",
        f"The {top} requests with the largest trim loss (ceiling - accepted, summed over their "
        "steps). The ceiling per step is observed, the shadow's, exact when the window was not "
        "fully accepted, or the tail walk's point estimate; unknown steps make the loss a lower "
        "bound.",
    )
    for arm in arms:
        if arm.top is None:
            s.missing.append(
                f"{arm.label}: no trimmed request-step has a known or estimated ceiling, so no "
                "trim loss is visible (a cap-accept shadow, or walks: greedy requests, or sampled "
                "ones with target log-probabilities, e.g. `ingest --assume greedy` for greedy "
                "traffic)"
            )
            continue
        s.tables.append(
            _rows_table(
                f"{arm.label}: top {arm.top.height} requests by trim loss",
                _REQUEST_COLUMNS,
                arm.top.iter_rows(named=True),
            )
        )
        s.figures += _arm_figures(
            w,
            6,
            arm.label,
            (arm.label, arm.top),
            [(requests_fig.top_requests_figure, "top-requests", "largest trim losses")],
        )
        if arm.traces is not None and arm.traces.height:
            rids = arm.top["rid"].head(TRACED_REQUESTS).to_list()
            s.figures += _arm_figures(
                w,
                6,
                arm.label,
                (arm.label, arm.traces, rids),
                [(requests_fig.traces_figure, "traces", "windows of the top requests")],
            )
    return s


# -- the whole report ----------------------------------------------------------------------


@dataclass
class Report:
    out: Path
    arms: list[Arm]
    sections: list[Section]
    html: Path
    markdown: Path
    json: Path


def _json(arms: list[Arm]) -> dict:
    out = {}
    for arm in arms:
        out[arm.label] = {
            "run": str(arm.run.path),
            "summary": arm.summary,
            "window_shares": arm.shares.to_dicts(),
            "load": arm.load.to_dicts(),
            "calibration": {
                stage: {
                    "overall": pooled(hist).compute(),
                    "workloads": {str(k): acc.compute() for k, acc in hist.items()},
                }
                for stage, hist in arm.calibration.items()
            },
            "cost": None
            if arm.cost is None
            else {
                "table": json.loads(arm.cost.table.to_json()),
                "fitted": vars(arm.cost.fitted),
                "own": None if arm.cost.own is None else vars(arm.cost.own),
                "cells": arm.cost.cells,
            },
            "estimate": arm.estimate,
            "top_requests": None if arm.top is None else arm.top.to_dicts(),
        }
    return clean_json(out)


def overlay_figures(run_dirs: list[Path], out: Path) -> list[Figure]:
    """The views that share axes across runs, overlaid: what `compare --out` writes.

    Only the cheap analyses (summary, window shares, load); no estimator pass,
    so the per-workload bars show the observed ceiling only.
    """
    out.mkdir(parents=True, exist_ok=True)
    arms = []
    for label, path in zip(arm_labels(list(run_dirs)), run_dirs, strict=True):
        run = open_run(path)
        gamma = int(run.manifest["gamma"])
        arms.append((label, summarize(run), window_shares(run.requests(), gamma), load_curve(run)))
    gamma = max(int(open_run(p).manifest["gamma"]) for p in run_dirs)
    w = FigureQueue(out, background=False)
    workload_rows = [
        (label, [{"workload": k, **v} for k, v in summary["workloads"].items()])
        for label, summary, _, _ in arms
    ]
    loads = [(label, load) for label, _, _, load in arms]
    figures = [
        w.save(1, workloads_fig.workload_figure, (workload_rows, gamma), "workloads", "Workloads"),
        w.save(
            1,
            workloads_fig.window_share_figure,
            ([(a[0], a[2]) for a in arms], gamma),
            "verify-windows",
            "Verify windows",
        ),
        w.save(2, load_fig.budget_figure, (loads,), "budget", "Budget per request vs bs"),
    ]
    if any(f["throughput_tokens_per_s"].is_not_null().any() for _, f in loads):
        figures.append(w.save(2, load_fig.throughput_figure, (loads,), "throughput", "Throughput"))
        figures.append(w.save(2, load_fig.step_time_figure, (loads,), "step-time", "Step time"))
    return figures


def build_report(
    run_dirs: list[Path],
    out: Path,
    *,
    top: int = 10,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Analyse every run and write report.html, summary.md, report.json and the PNGs to `out`."""
    step = progress or (lambda _msg: None)
    runs = [open_run(p) for p in run_dirs]
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        if old.name[:1].isdigit():
            old.unlink()
    rows = sum(r.requests().select(pl.len()).collect().item() for r in runs if _has_requests(r))
    w = FigureQueue(out, background=rows >= BACKGROUND_FIGURES_ROWS)
    try:
        arms = []
        for label, run in zip(arm_labels(list(run_dirs)), runs, strict=True):
            step(f"{label}: summary, load, cost model, trim loss")
            arms.append(analyse(label, run, top))
        load = load_section(arms, w)
        cost = cost_section(arms, w)
        requests = requests_section(arms, w, top)
        for arm in arms:
            step(f"{arm.label}: ceiling estimator")
            arm.estimate = evaluate(arm.run)
        workloads = workloads_section(arms, w)
        estimator = estimator_section(arms, w)
        for arm in arms:
            step(f"{arm.label}: calibration")
            arm.calibration = calibration_histograms(arm.run)
        calibration = calibration_section(arms, w)
        step("drawing figures")
    finally:
        w.close()
    sections = [workloads, load, calibration, cost, estimator, requests]
    title = "DSpark run report: " + ", ".join(a.label for a in arms)
    meta = [
        f"{a.label}: {a.run.path} — mode {a.run.manifest.get('mode')}"
        f"{' + ' + a.run.manifest['shadow'] + ' shadow' if a.run.manifest.get('shadow') else ''}, "
        f"gamma {a.gamma}, source {a.run.manifest.get('source', '?')}, "
        f"timing {a.run.manifest.get('timing') or 'unknown'}, "
        f"{a.summary['overall']['steps']:,} steps, "
        f"{a.summary['overall']['request_steps']:,} request-steps"
        for a in arms
    ]
    md = out / "summary.md"
    md.write_text(markdown(title, meta, sections), encoding="utf-8")
    page = out / "report.html"
    page.write_text(html_page(title, meta, sections), encoding="utf-8")
    js = out / "report.json"
    js.write_text(json.dumps(_json(arms), indent=1), encoding="utf-8")
    return Report(out, arms, sections, page, md, js)
