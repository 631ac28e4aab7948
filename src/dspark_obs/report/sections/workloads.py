"""The report's first section: per workload, the window, what was accepted and the ceiling.

It is the section that needs the estimator's evaluation (the estimated ceiling beside the
observed one), so the report builds it once that pass has run.
"""

from __future__ import annotations

from ...numbers import fmt
from ..arms import Arm, arms_palette
from ..document import Section, Table
from ..figure_queue import FigureQueue
from ..figures import workloads as workloads_fig
from .tables import Cell, name_cell, num_cell, rows_table

NO_CEILING = (
    "no observed ceiling: a compact run shows it only with a cap-accept shadow "
    "(`dspark-obs shadow`, or `run --shadow cap-accept`); the estimator section estimates it"
)


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
    "workload": name_cell("workload"),
    "request-steps": num_cell("request_steps"),
    "window": num_cell("mean_window"),
    "accepted": num_cell("mean_accepted"),
    "committed": num_cell("mean_committed"),
    "ceiling (observed)": num_cell("mean_ceiling"),
    "ceiling (walk) [lo, hi]": lambda r: (
        f"{fmt(r['estimated_ceiling'])} [{fmt(r['estimated_lo'])}, {fmt(r['estimated_hi'])}]"
    ),
    "ceiling (population)": num_cell("population_ceiling"),
    "utilisation": num_cell("utilisation"),
    "trimmed tokens": num_cell("trimmed_tokens"),
}


def _group_rows(arm: Arm) -> list[dict]:
    """A fleet's per (node / rank / mode, workload) rows: the summary's groups with the
    estimate's walk bracket of the same group."""
    est = {
        tuple(g[k] for k in (*arm.by, "workload")): g
        for g in (arm.estimate or {}).get("groups", [])
    }
    rows = []
    for group in arm.summary.get("groups", []):
        for name, entry in group["workloads"].items():
            keys = tuple(group[k] for k in arm.by)
            walk = est.get((*keys, name), {}).get("all_steps") or {}
            rows.append(
                {
                    "group": " ".join(f"{k}={v}" for k, v in zip(arm.by, keys, strict=True)),
                    "workload": name,
                    **entry,
                    "estimated_ceiling": walk.get("point"),
                    "estimated_lo": walk.get("lo"),
                    "estimated_hi": walk.get("hi"),
                }
            )
    return rows


_GROUP_COLUMNS: dict[str, Cell] = {
    "group": name_cell("group"),
    **{k: v for k, v in _WORKLOAD_COLUMNS.items() if k != "ceiling (population)"},
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
            rows_table(
                f"{arm.label}: per workload",
                _WORKLOAD_COLUMNS,
                _workload_rows(arm),
                f"observed ceiling source: {arm.summary['overall']['ceiling_source'] or 'none'}",
                headline=True,
            )
        )
        if arm.by:
            s.tables.append(
                rows_table(
                    f"{arm.label}: per {', '.join(arm.by)} and workload",
                    _GROUP_COLUMNS,
                    _group_rows(arm),
                    "each group's own figures; the walk bracket is the group's walked blocks",
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
    palette = arms_palette(arms)
    s.figures.append(
        w.save(
            1,
            workloads_fig.workload_figure,
            ([(a.label, _workload_rows(a)) for a in arms], gamma, palette),
            "workloads",
            "Window, accepted and ceiling per workload",
        )
    )
    s.figures.append(
        w.save(
            1,
            workloads_fig.window_share_figure,
            ([(a.label, a.shares) for a in arms], gamma, palette),
            "verify-windows",
            "Distribution of verify windows per workload",
        )
    )
    return s
