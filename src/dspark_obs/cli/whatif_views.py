"""Tables of what-if predictions: each policy per load level, and the cost of trimming."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..whatif.headline import signed
from .views import _fmt


def render_whatif(report: dict, console: Console, *, workloads: bool) -> None:
    """One row per policy and level (and workload with `workloads`): predicted figures."""
    table = Table(
        title=f"{report['run']}  mode={report['mode']}  gamma={report['gamma']}  "
        f"cost table: {report['cost_table']}",
        title_justify="left",
    )
    for col in ("policy", "bs", "workload", "window", "accepted", "verify tok", "step ms",
                "tokens/s", "interval", "per-req tok/s"):  # fmt: skip
        label = col in ("policy", "workload")
        table.add_column(col, justify="left" if label else "right", no_wrap=label)
    cells = [c for c in report["cells"] if workloads or c["workload"] == "all"]
    for i, c in enumerate(cells):
        last = i + 1 == len(cells) or cells[i + 1]["policy"] != c["policy"]
        table.add_row(
            c["policy"],
            _fmt(c["level"]),
            c["workload"],
            _fmt(c["mean_window"]),
            _fmt(c["mean_accepted"]),
            _fmt(c["verify_tokens_per_step"], 1),
            _fmt(c["step_ms"], 3),
            _fmt(c["tokens_per_s"], 0),
            f"{_fmt(c['tokens_per_s_lo'], 0)} – {_fmt(c['tokens_per_s_hi'], 0)}",
            _fmt(c["per_request_tokens_per_s"], 1),
            end_section=last,
        )
    console.print(table)
    console.print(
        f"[dim]{report['unknown_ceilings']:,} of {report['request_steps']:,} request-steps had "
        "an unknown ceiling (trimmed, no shadow, no exact walk): the ceiling estimator "
        "fills them; intervals cover that and the spread between two runs of a policy[/dim]"
    )


def render_trim_cost(entries: list[dict], console: Console) -> None:
    """The headline: net tokens/s of the run's policy against static, per load level."""
    if not entries:
        return
    table = Table(title="cost of trimming against static (whole batch)", title_justify="left")
    for col in ("bs", "tokens/s", "static", "net", "interval", "net %", "step time saved",
                "accepted lost", "trimmed/req-step"):  # fmt: skip
        table.add_column(col, justify="right")
    for e in entries:
        if e["workload"] != "all":
            continue
        table.add_row(
            _fmt(e["level"]),
            _fmt(e["tokens_per_s"], 0),
            _fmt(e["static_tokens_per_s"], 0),
            signed(e["net_tokens_per_s"]),
            f"{signed(e['net_lo'])} – {signed(e['net_hi'])}",
            signed(None if e["net_share"] is None else 100 * e["net_share"], 1),
            signed(e["step_time_saved"]),
            signed(e["accepted_lost"]),
            _fmt(e["trimmed_tokens_per_request_step"], 3),
        )
    console.print(table)
