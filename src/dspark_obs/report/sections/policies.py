"""The cost-of-trimming section: the run's policy against static, and other policies.

It answers the operator's first question, so it opens the report: is trimming worth it on
this traffic, and would another setting do better? Its numbers are `whatif`'s
(`arms.predict_policies`): the cost of trimming per level and workload (net tokens/s
against static, split into step time saved and accepted tokens lost), each policy's
predicted throughput, and where each policy's curve crosses static's.
"""

from __future__ import annotations

from ...numbers import delta, interval
from ...whatif.crossing import crossings
from ...whatif.headline import trim_headline
from ..arms import Arm
from ..document import Section
from ..figure_queue import FigureQueue, arm_figures
from ..figures import policies as policies_fig
from .tables import Cell, num_cell, rows_table

#: The section's figure files start with this number, so they sort first, as it is shown.
SECTION_NUMBER = 0


def _signed_cell(key: str, digits: int = 1, scale: float = 1.0) -> Cell:
    return lambda r: delta(None if r[key] is None else scale * r[key], digits)


_TRIM_COLUMNS: dict[str, Cell] = {
    "bs": num_cell("level"),
    "workload": lambda r: r["workload"],
    "tokens/s": num_cell("tokens_per_s", 0),
    "static tokens/s": num_cell("static_tokens_per_s", 0),
    "net tokens/s": _signed_cell("net_tokens_per_s"),
    "interval": lambda r: interval(r["net_lo"], r["net_hi"], 1, signed=True),
    "net %": _signed_cell("net_share", 2, 100.0),
    "step time saved tok/s": _signed_cell("step_time_saved"),
    "accepted lost tok/s": _signed_cell("accepted_lost"),
    "trimmed/req-step": num_cell("trimmed_tokens_per_request_step"),
}

_POLICY_COLUMNS: dict[str, Cell] = {
    "policy": lambda r: r["policy"],
    "bs": num_cell("level"),
    "window": num_cell("mean_window"),
    "verify tokens/step": num_cell("verify_tokens_per_step", 1),
    "accepted": num_cell("mean_accepted"),
    "step ms": num_cell("step_ms", 3),
    "tokens/s": num_cell("tokens_per_s", 0),
    "interval": lambda r: interval(r["tokens_per_s_lo"], r["tokens_per_s_hi"]),
    "vs static %": _signed_cell("vs_static", 2, 100.0),
}


def headline(arm: Arm) -> str:
    """The arm's cost of trimming in one line (the report's header shows it per arm)."""
    if arm.whatif is None:
        return f"{arm.label}: cost of trimming not predicted: {arm.whatif_missing}"
    return (
        f"{arm.label}: cost of trimming, net tokens/s of the run's policy against static "
        f"(whole batches; interval: the ceiling bracket): {trim_headline(arm.whatif['trim_cost'])}"
    )


def _timed_whole(cells: list[dict], policy: str) -> list[dict]:
    return [
        c for c in cells if c["policy"] == policy and c["workload"] == "all" and c["tokens_per_s"]
    ]


def _curve(cells: list[dict], name: str, static: dict) -> dict:
    rows = [c for c in _timed_whole(cells, name) if c["level"] in static]
    return {
        "policy": name,
        "levels": [c["level"] for c in rows],
        "tokens_per_s": [c["tokens_per_s"] for c in rows],
        "lo": [c["tokens_per_s_lo"] for c in rows],
        "hi": [c["tokens_per_s_hi"] for c in rows],
    }


def policy_curves(report: dict) -> tuple[list[dict], dict, list[dict]]:
    """The figure's curves (static first, then every other predicted policy but `own`), the
    run's own points, and the crossings with static of each curve and of the run (`own`,
    named `this run`)."""
    cells = report["cells"]
    names = list(dict.fromkeys(c["policy"] for c in cells if c["policy"] != "own"))
    names.sort(key=lambda p: p != "static")
    static = {c["level"]: c["tokens_per_s"] for c in _timed_whole(cells, "static")}
    curves = [_curve(cells, name, static) for name in names]
    own = _curve(cells, "own", static)
    marks = []
    for name, c in [("this run", own), *((c["policy"], c) for c in curves[1:])]:
        rel = [y / static[lv] - 1 for lv, y in zip(c["levels"], c["tokens_per_s"], strict=True)]
        marks += [{"policy": name, **m} for m in crossings(c["levels"], rel)]
    return curves, own, marks


def _crossing_text(marks: list[dict]) -> str:
    if not marks:
        return "No policy's curve crosses static's between the run's load levels."
    return "Crossings with static: " + "; ".join(
        f"{m['policy']} at about bs {m['bs']:,.1f} (between bs {m['lo']:,} and {m['hi']:,})"
        for m in marks
    ) + "."  # fmt: skip


def policies_section(arms: list[Arm], w: FigureQueue) -> Section:
    s = Section(
        "policies",
        "Cost of trimming and other policies",
        "What the run's verify policy gained against verifying every draft (static), on the "
        "run's own traffic: net tokens/s = step time saved (the run's tokens at its cheaper "
        "steps) + accepted tokens lost (what trimming gave up, at static's step time; <= 0). "
        "A positive net means trimming paid. The interval is the ceiling estimator's bracket "
        "on what static would have accepted where the run trimmed; trimmed/req-step is "
        "static's mean accepted drafts minus the run's. Below, each policy `whatif` predicts "
        "from the same run, with 95 % intervals (docs/whatif.md says what they assume).",
    )
    for arm in arms:
        if arm.whatif is None:
            s.missing.append(f"{arm.label}: nothing predicted: {arm.whatif_missing}")
            continue
        report = arm.whatif
        for spec, why in report["unavailable"].items():
            s.missing.append(f"{arm.label}: policy {spec} not predicted: {why}")
        curves, own, marks = policy_curves(report)
        s.headline.append(headline(arm))
        note = f"{headline(arm)}. {_crossing_text(marks)}"
        s.tables.append(
            rows_table(
                f"{arm.label}: cost of trimming against static",
                _TRIM_COLUMNS,
                report["trim_cost"],
                note,
            )
        )
        static = {c["level"]: c["tokens_per_s"] for c in _timed_whole(report["cells"], "static")}
        rows = [
            {**c, "vs_static": c["tokens_per_s"] / static[c["level"]] - 1}
            for c in report["cells"]
            if c["workload"] == "all" and c["tokens_per_s"] and static.get(c["level"])
        ]
        s.tables.append(
            rows_table(f"{arm.label}: predicted throughput by policy", _POLICY_COLUMNS, rows)
        )
        if curves and curves[0]["levels"]:
            s.figures += arm_figures(
                w,
                SECTION_NUMBER,
                arm.label,
                (curves, own, marks),
                [(policies_fig.policies_figure, "policies", "predicted throughput by policy")],
            )
    return s
