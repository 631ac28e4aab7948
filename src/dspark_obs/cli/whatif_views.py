"""Tables of what-if predictions: each policy per load level, and the cost of trimming."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..numbers import delta, interval, number, percent
from ..terminal import print_table
from ..whatif.headline import trim_headline


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
            number(c["level"]),
            c["workload"],
            number(c["mean_window"]),
            number(c["mean_accepted"]),
            number(c["verify_tokens_per_step"], 1),
            number(c["step_ms"], 3),
            number(c["tokens_per_s"], 0),
            interval(c["tokens_per_s_lo"], c["tokens_per_s_hi"]),
            number(c["per_request_tokens_per_s"], 1),
            end_section=last,
        )
    print_table(console, table)
    console.print(
        f"[dim]{report['unknown_ceilings']:,} of {report['request_steps']:,} request-steps had "
        "an unknown ceiling (trimmed, no shadow, no exact walk): the ceiling estimator "
        "fills them; intervals cover that and the spread between two runs of a policy[/dim]"
    )


def render_trim_cost(entries: list[dict], console: Console) -> None:
    """The headline: net tokens/s of the run's policy against static, per load level."""
    if not entries:
        return
    table = Table(
        title="cost of trimming against static (whole batch, tokens/s)", title_justify="left"
    )
    for col in ("bs", "tokens/s", "static", "net", "interval", "net %", "step time saved",
                "accepted lost", "trimmed/req-step"):  # fmt: skip
        table.add_column(col, justify="right")
    for e in entries:
        if e["workload"] != "all":
            continue
        table.add_row(
            number(e["level"]),
            number(e["tokens_per_s"], 0),
            number(e["static_tokens_per_s"], 0),
            delta(e["net_tokens_per_s"]),
            interval(e["net_lo"], e["net_hi"], signed=True),
            percent(e["net_share"], signed=True),
            delta(e["step_time_saved"]),
            delta(e["accepted_lost"]),
            number(e["trimmed_tokens_per_request_step"], 3),
        )
    print_table(console, table)


def render_trim_cost_pair(trim: dict, missing: dict, console: Console) -> None:
    """`compare`'s cost of trimming: each run's policy against its own static, A beside B
    at every load level (whole batches), and each run's headline; a run that could not be
    predicted says why."""
    whole = {
        name: {e["level"]: e for e in entries if e["workload"] == "all"}
        for name, entries in trim.items()
        if entries
    }
    for name in ("a", "b"):
        if trim[name] is None:
            console.print(f"[yellow]{name.upper()}: no cost of trimming:[/] {missing[name]}")
        else:
            console.print(f"{name.upper()}: cost of trimming: {trim_headline(trim[name])}")
    if not whole:
        return
    table = Table(
        title="cost of trimming against static, A and B (whole batch, tokens/s)",
        title_justify="left",
    )
    for col in ("bs", "run", "tokens/s", "static", "net (%)", "interval", "saved", "lost",
                "trimmed/req-step"):  # fmt: skip
        table.add_column(col, justify="left" if col == "run" else "right", no_wrap=True)
    levels = sorted({level for rows in whole.values() for level in rows})
    for level in levels:
        present = [(name, rows[level]) for name, rows in whole.items() if level in rows]
        for i, (name, e) in enumerate(present):
            table.add_row(
                number(level),
                name.upper(),
                number(e["tokens_per_s"], 0),
                number(e["static_tokens_per_s"], 0),
                f"{delta(e['net_tokens_per_s'], 1)} ({percent(e['net_share'], 2, signed=True)})",
                interval(e["net_lo"], e["net_hi"], 1, signed=True),
                delta(e["step_time_saved"], 1),
                delta(e["accepted_lost"], 1),
                number(e["trimmed_tokens_per_request_step"], 3),
                end_section=i + 1 == len(present),
            )
    print_table(console, table)
    console.print(
        "[dim]each run against static predicted on its own traffic: net = saved + lost "
        "(tokens/s); interval: the bracket on what static would have accepted where the run "
        "trimmed; trimmed: static's mean accepted drafts minus the run's, per request-step[/dim]"
    )
