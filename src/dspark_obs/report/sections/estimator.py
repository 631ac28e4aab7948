"""The estimator section: the ceiling the tail walks and the population model recover.

Where a cap-accept shadow ran its ceiling is the truth, and the section shows each
estimate's error against it; without one it shows the estimates alone.
"""

from __future__ import annotations

from ...numbers import fmt
from ..arms import Arm, arms_palette
from ..document import Section, Table
from ..figure_queue import FigureQueue, arm_figures
from ..figures import estimator as estimator_fig


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
    palette = arms_palette(arms)
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
        figures = [(estimator_fig.estimates_figure, "estimates", "estimated vs true ceiling")]
        if any((e.get("population") or {}) for e in report["workloads"].values()):
            figures.append((estimator_fig.survival_figure, "survival", "survival of the ceiling"))
        else:
            s.missing.append(
                f"{arm.label}: no survival curves: the population model is fitted to one run's "
                "rows, so a fleet has none (`dspark-obs estimate RUN_DIR` per run)"
            )
        s.figures += arm_figures(w, 5, arm.label, (arm.label, report, palette), figures)
    return s
