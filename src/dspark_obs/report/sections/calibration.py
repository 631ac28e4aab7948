"""The calibration section: does the drafter's predicted survival match what was accepted?

Before and after STS are compared per block position; a run without confidence or without
the raw logits says which of the two it cannot show.
"""

from __future__ import annotations

from ...analysis.reliability import RAW, RECORDED, pooled
from ...numbers import fmt
from ..arms import Arm
from ..document import Section, Table
from ..figure_queue import FigureQueue, arm_figures
from ..figures import calibration as calibration_fig

NO_CONFIDENCE = (
    "no confidence recorded: the drafter has no confidence head, or `reqs` was not dumped"
)
NO_RAW = (
    "no raw confidence logits, so no before-STS view: SGLang saves them with "
    "SGLANG_DSPARK_STS_COLLECT_PATH; the reference runtime records them always"
)


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
        if all(m.get("sts") is None for m in arm.manifests):
            note += " (this run had no STS, so both are the raw confidence)"
        s.tables.append(Table(f"{arm.label}: calibration per position", columns, rows, note))
        s.figures += arm_figures(
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
