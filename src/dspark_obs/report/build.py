"""`dspark-obs report`: every view of one or more runs, analysed once, written three ways.

Several runs are one fleet (`fleet_arm`: the nodes and ranks of one deployment, merged
as `summary`, `calibration` and `estimate` merge them, with a breakdown per node, rank or
mode where asked), or, with `arms`, each run its own *arm* for a side-by-side comparison;
a single run is one arm. The analyses (`dspark_obs.analysis`, the estimator's
evaluation, the cost fit) run per arm on the lazy Parquet tables; the figures
overlay arms where the axes are shared (load curves, per-workload bars) and
repeat per arm where they are not (reliability, cost, drill-down). What a run
cannot support (no shadow, no logits, no step times, no sweep) becomes a
`missing` line naming what is absent and how to record it.

This module orders the work and writes the outputs: `arms` analyses each run, `sections`
turns the arms into each section's tables and figures, `figure_queue` draws the figures.
The order matters for speed, not for the result: the heavy passes (calibration histograms,
the estimator's evaluation) run after the light sections' figures are queued, and the
calibration before the evaluation, so that its reliability grid (the figure slowest to
draw) is drawn while the evaluation runs; what is left to draw at the end is the
estimator's few bars and lines.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from .. import strict_json
from ..analysis.load import load_curve
from ..analysis.reliability import pooled
from ..analysis.summary import summarize
from ..analysis.verify_lengths import window_shares
from ..engine import Engine, InProcessEngine
from ..outputs import WRITTEN, OwnedFiles, check_target, prepare_dir, write_file
from ..palette import workload_palette
from ..store import open_run
from ..store.fleet import expand_run_dirs, run_labels, single_run
from ..strict_json import clean_json
from .arms import Arm, analyse, has_requests, predict_policies, run_calibration, run_estimate
from .document import Figure, Section, html_page, markdown
from .figure_queue import BACKGROUND_FIGURES_ROWS, FigureQueue
from .figures import load as load_fig
from .figures import workloads as workloads_fig
from .fleet_arm import analyse_fleet, fleet_calibration, fleet_estimate, fleet_predict
from .sections import (
    calibration_section,
    cost_section,
    estimator_section,
    load_section,
    policies_section,
    requests_section,
    workloads_section,
)
from .sections.policies import headline as policy_headline

__all__ = ["Report", "build_report", "overlay_figures"]


@dataclass
class Report:
    out: Path
    arms: list[Arm]
    sections: list[Section]
    html: Path
    markdown: Path
    json: Path


#: The report's files beside its figures: the page, its Markdown and its JSON.
REPORT_FILES = ("summary.md", "report.html", "report.json")


def _json(arms: list[Arm]) -> dict:
    out = {}
    for arm in arms:
        out[arm.label] = {
            "run": None if arm.fleet or arm.run is None else str(arm.run.path),
            **({"runs": arm.fleet.describe(), "by": list(arm.by)} if arm.fleet else {}),
            **({"unread": arm.unread} if arm.unread else {}),
            "summary": arm.summary,
            "window_shares": arm.shares.to_dicts(),
            "load": arm.load.to_dicts(),
            "calibration": {
                stage: {
                    "overall": pooled(hist).compute(),
                    "workloads": {str(k): acc.compute() for k, acc in hist.items()},
                    **({"groups": arm.calibration_groups[stage]} if arm.fleet else {}),
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
            "whatif": arm.whatif,
            "whatif_missing": arm.whatif_missing,
        }
    return clean_json(out)


def overlay_figures(run_dirs: list[Path], out: Path) -> list[Figure]:
    """The views that share axes across runs, overlaid: what `compare --out` writes.

    Only the cheap analyses (summary, window shares, load); no estimator pass,
    so the per-workload bars show the observed ceiling only.
    """
    out = prepare_dir(out)
    arms = []
    for label, path in zip(run_labels(list(run_dirs)), run_dirs, strict=True):
        run = open_run(path)
        gamma = run.gamma
        arms.append((label, summarize(run), window_shares(run.requests(), gamma), load_curve(run)))
    gamma = max(open_run(p).gamma for p in run_dirs)
    palette = workload_palette(name for _, summary, _, _ in arms for name in summary["workloads"])
    w = FigureQueue(out, background=False)
    try:
        figures = _overlays(w, arms, gamma, palette)
    except BaseException:
        w.discard()
        raise
    w.publish()
    return figures


def _overlays(w: FigureQueue, arms: list[tuple], gamma: int, palette: dict) -> list[Figure]:
    workload_rows = [
        (label, [{"workload": k, **v} for k, v in summary["workloads"].items()])
        for label, summary, _, _ in arms
    ]
    loads = [(label, load) for label, _, _, load in arms]
    figures = [
        w.save(
            1,
            workloads_fig.workload_figure,
            (workload_rows, gamma, palette),
            "workloads",
            "Workloads",
        ),
        w.save(
            1,
            workloads_fig.window_share_figure,
            ([(a[0], a[2]) for a in arms], gamma, palette),
            "verify-windows",
            "Verify windows",
        ),
        w.save(2, load_fig.budget_figure, (loads,), "budget", "Budget per request vs bs"),
    ]
    if any(f["throughput_tokens_per_s"].is_not_null().any() for _, f in loads):
        figures.append(w.save(2, load_fig.throughput_figure, (loads,), "throughput", "Throughput"))
        figures.append(w.save(2, load_fig.step_time_figure, (loads,), "step-time", "Step time"))
    return figures


def _meta(arm: Arm) -> str:
    if arm.fleet is not None:
        where = f"{len(arm.fleet.paths)} runs ({', '.join(arm.fleet.nodes)})"
    else:
        assert arm.run is not None
        where = str(arm.run.path)
    shadow = arm.manifest_value("shadow")
    return (
        f"{arm.label}: {where} — mode {arm.manifest_value('mode') or 'mixed'}"
        f"{' + ' + str(shadow) + ' shadow' if shadow else ''}, "
        f"gamma {arm.gamma}, source {arm.manifest_value('source') or '?'}, "
        f"timing {arm.manifest_value('timing') or 'unknown'}, "
        f"{arm.summary['overall']['steps']:,} steps, "
        f"{arm.summary['overall']['request_steps']:,} request-steps"
    )


def _each_arm(arms: list[Arm], step: Callable, what: str, of_run: Callable, of_fleet: Callable):
    """One pass over every arm: a run's form, or a fleet's (whose runs are read again)."""
    for arm in arms:
        step(f"{arm.label}: {what}")
        (of_run if arm.fleet is None else of_fleet)(arm)


def build_report(
    run_dirs: list[Path],
    out: Path,
    *,
    top: int = 10,
    progress: Callable[[str], None] | None = None,
    arms: bool = False,
    by: tuple[str, ...] = (),
    engine: Engine | None = None,
    strict: bool = True,
) -> Report:
    """Analyse the runs and write report.html, summary.md, report.json and the PNGs to `out`.

    One run is one arm. Several runs (or a directory of runs) are one fleet arm, refused
    with a RunStoreError where `store.fleet.open_fleet` refuses to merge them; `by` adds
    the per node / rank / mode breakdown. With `arms` each run is its own arm instead.
    A fleet's runs are read by `engine` (in this process by default; any `engine` makes
    even one run a fleet of one); a run it cannot read is an error with `strict`, else
    named in the report (`unread`).
    """
    step = progress or (lambda _msg: None)
    as_fleet = not arms and (engine is not None or not single_run(run_dirs, by))
    if not as_fleet:
        run_dirs = expand_run_dirs(run_dirs)  # a directory of runs is each of its runs
        runs = [open_run(p) for p in run_dirs]
    out = prepare_dir(out)
    texts = [out / name for name in (*REPORT_FILES, WRITTEN)]
    for path in texts:  # refused now, not after minutes of analysis
        check_target(path)
    owned = OwnedFiles(out)  # what an earlier report wrote there, and only that, is replaced
    w = None
    published = False
    try:
        if as_fleet:
            step("fleet: summary, load, cost model, trim loss")
            arm_list = [analyse_fleet(engine or InProcessEngine(), run_dirs, by, top, strict)]
            rows = arm_list[0].summary["overall"]["request_steps"]
        else:
            rows = sum(
                r.requests().select(pl.len()).collect().item() for r in runs if has_requests(r)
            )
        w = FigureQueue(out, background=rows >= BACKGROUND_FIGURES_ROWS)
        if not as_fleet:
            arm_list = []
            for label, run in zip(run_labels(list(run_dirs)), runs, strict=True):
                step(f"{label}: summary, load, cost model, trim loss")
                arm_list.append(analyse(label, run, top))
        load = load_section(arm_list, w)
        cost = cost_section(arm_list, w)
        requests = requests_section(arm_list, w, top)
        _each_arm(arm_list, step, "what-if policies, cost of trimming", predict_policies,
                  fleet_predict)  # fmt: skip
        policies = policies_section(arm_list, w)
        _each_arm(arm_list, step, "calibration", run_calibration, fleet_calibration)
        calibration = calibration_section(arm_list, w)
        _each_arm(arm_list, step, "ceiling estimator", run_estimate, fleet_estimate)
        workloads = workloads_section(arm_list, w)
        estimator = estimator_section(arm_list, w)
        step("drawing figures")
        w.close()
        w.publish(texts)  # every name checked before any is written
        published = True
    finally:
        if w is not None and not published:
            try:
                w.close()
            finally:
                w.discard()
    sections = [policies, workloads, load, calibration, cost, estimator, requests]
    title = "DSpark run report: " + ", ".join(a.label for a in arm_list)
    meta = [_meta(a) for a in arm_list]
    meta += [policy_headline(a) for a in arm_list]
    md_name, html_name, json_name = REPORT_FILES
    md = write_file(out / md_name, markdown(title, meta, sections), durable=False)
    page = write_file(out / html_name, html_page(title, meta, sections), durable=False)
    js_text = strict_json.dumps(_json(arm_list), indent=1)
    js = write_file(out / json_name, js_text, durable=False)
    written = {p.name for p in (md, page, js)} | {f.path.name for s in sections for f in s.figures}
    owned.remove_stale(written)
    owned.record(written)
    return Report(out, arm_list, sections, page, md, js)
