"""Tables several commands print: a run's summary, and its ceiling estimates beside the truth."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .. import strict_json
from ..numbers import number
from ..terminal import make_console, print_table
from ..whatif.headline import trimmed_by_workload
from .output import print_csv


def timing_text(timing: str | None) -> str:
    """A run's `timing` for people: `simulated`, `measured`, or that it has no step times
    (runs ingested from dumps that carry none)."""
    return timing or "none (no step times recorded)"


_ENTRY_COLUMNS = (
    "steps",
    "req-steps",
    "window",
    "accepted",
    "committed",
    "ceiling",
    "util",
    "verify tok",
    "tokens/s",
)


def _entry_cells(e: dict) -> list[str]:
    return [
        number(e["steps"]),
        number(e["request_steps"]),
        number(e["mean_window"]),
        number(e["mean_accepted"]),
        number(e["mean_committed"]),
        number(e["mean_ceiling"]),
        number(e["utilisation"], 3),
        number(e["mean_verify_tokens"]),
        number(e["throughput_tokens_per_s"], 0),
    ]


def _groups_table(summary: dict) -> Table:
    """A fleet's figures per group of its `--by` keys, each group's workloads then its total."""
    by = summary["by"]
    table = Table(title=f"by {', '.join(by)}", title_justify="left")
    for col in (*by, "workload", *_ENTRY_COLUMNS):
        table.add_column(col, justify="left" if col in (*by, "workload") else "right")
    for group in summary["groups"]:
        keys = [str(group[k]) for k in by]
        rows = [*group["workloads"].items(), ("overall", group["overall"])]
        for name, e in rows:
            table.add_row(*keys, str(name), *_entry_cells(e), end_section=name == "overall")
    return table


def render_summary(summary: dict, console: Console) -> None:
    runs = summary.get("runs")
    if runs and len(runs) > 1:
        nodes = ", ".join(r["node"] for r in runs)
        title = f"{len(runs)} runs ({nodes})  mode={summary['mode'] or 'mixed'}"
    else:
        title = f"{summary['run']}  mode={summary['mode']}"
    if summary["shadow"]:
        title += f" (+{summary['shadow']} shadow)"
    title += f"  gamma={summary['gamma']}  timing={timing_text(summary['timing'])}"
    table = Table(title=title, title_justify="left")
    # static's accepted drafts minus the run's, per request-step (the cost of trimming's)
    trimmed = trimmed_by_workload(summary["trim_cost"]) if summary.get("trim_cost") else None
    columns = list(_ENTRY_COLUMNS)
    if trimmed is not None:
        columns.insert(columns.index("util") + 1, "trimmed")
    for col in ("workload", *columns):
        table.add_column(col, justify="left" if col == "workload" else "right")
    rows = [*summary["workloads"].items(), ("overall", summary["overall"])]
    for name, e in rows:
        cells = _entry_cells(e)
        if trimmed is not None:
            key = "all" if name == "overall" else name
            cells.insert(columns.index("trimmed"), number(trimmed.get(key), 3))
        table.add_row(name, *cells, end_section=name == rows[-2][0])
    print_table(console, table)
    if summary["load"] and any(r["budget_per_request"] is not None for r in summary["load"]):
        load = Table(title="load: budget per request by batch size", title_justify="left")
        for col in ("bs", "steps", "budget/req", "verify tok/step", "step ms"):
            load.add_column(col, justify="right")
        for r in summary["load"]:
            load.add_row(
                number(r["bs"]),
                number(r["steps"]),
                number(r["budget_per_request"]),
                number(r["verify_tokens_per_step"], 1),
                number(r["mean_step_ms"]),
            )
        print_table(console, load)
    if summary.get("groups"):
        print_table(console, _groups_table(summary))
    console.print(f"[dim]{_footer(summary, trimmed is not None)}[/dim]")
    if summary.get("trim_cost"):
        from .whatif_views import render_trim_cost

        render_trim_cost(summary["trim_cost"], console)


def _footer(summary: dict, trimmed: bool) -> str:
    """What the columns shown mean, and only those: a fleet has no trimmed column, a run
    without a known ceiling no utilisation."""
    fleet = len(summary.get("runs") or ()) > 1
    ceiling = summary["overall"]["ceiling_source"]
    lines = [
        {
            "observed": "ceiling observed (full-block verification)",
            "shadow": "ceiling from the cap-accept shadow twin",
            None: f"ceiling not observed in {'these runs' if fleet else 'this run'} (compact "
            "without shadow: `estimate` gives the walk's estimate)",
        }[ceiling]
    ]
    if ceiling is not None:
        lines.append("utilisation = accepted / ceiling over rows with a known ceiling")
    if trimmed:
        lines.append(
            "trimmed = static's predicted accepted drafts minus the run's, per request-step"
        )
    rate = "tokens/s = committed tokens over step time"
    if fleet or summary.get("groups"):
        rate += ", summed over the ranks and nodes (they serve side by side)"
    if summary["timing"] == "simulated":
        rate += " (simulated step times)"
    lines.append(rate)
    return "; ".join(lines)


def summary_records(summary: dict) -> list[dict]:
    """`--csv`'s rows: each workload's entry and the overall one, then each group's."""
    by = summary.get("by") or []
    out = []
    for keys, entries in [
        ({k: None for k in by}, summary),
        *(({k: g[k] for k in by}, g) for g in summary.get("groups") or ()),
    ]:
        for name, entry in [*entries["workloads"].items(), ("overall", entries["overall"])]:
            out.append({**keys, "workload": name, **entry})
    return out


def print_summary(summary: dict, *, as_json: bool, as_csv: bool = False) -> None:
    if as_json:
        print(strict_json.dumps(summary, indent=2))
    elif as_csv:
        print_csv(summary_records(summary))
    else:
        render_summary(summary, make_console())


def estimate_records(report: dict) -> list[dict]:
    """`--csv`'s rows: one per workload (and group) and method, with the truth beside."""
    by = report.get("by") or []
    groups = [({k: None for k in by}, name, e) for name, e in report["workloads"].items()]
    groups += [({k: g[k] for k in by}, g["workload"], g) for g in report.get("groups") or ()]
    out = []
    for keys, name, entry in groups:
        shared = {k: v for k, v in entry.items() if not isinstance(v, dict) and k not in keys}
        shared.pop("workload", None)
        for method, figures in entry.items():
            if isinstance(figures, dict):
                out.append({**keys, "workload": name, "method": method, **shared, **figures})
    return out


def _f(x, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def print_estimates(report: dict) -> None:
    """The estimators against the truth, per workload and method (`evaluate`'s report)."""
    console = make_console()
    runs = report.get("runs") or []
    source = report["run"] or f"{len(runs)} runs ({', '.join(r['node'] for r in runs)})"
    table = Table(
        title=f"{source}: ceiling estimates vs truth (accepted drafts per request-step)",
        title_justify="left",
    )
    for col in (
        "workload",
        "method",
        "blocks",
        "truth",
        "lo",
        "point",
        "hi",
        "error",
        "covered",
        "exact/censored",
        "extrapolated",
        "unident.",
        "calibrated",
    ):
        label = col in ("workload", "method")
        table.add_column(col, justify="left" if label else "right", no_wrap=label)
    for name, e in report["workloads"].items():
        for method in ("greedy", "sampled"):
            m = e[method]
            if not m.get("blocks"):
                continue
            err = m.get("error")
            rates = (
                f"{m['exact_rate']:.3f}/{m['censored_rate']:.3f}"
                if method == "greedy"
                else f"—/{m['censored_rate']:.3f}"
            )
            table.add_row(
                name,
                f"{method} walk",
                f"{m['blocks']:,}",
                _f(m.get("truth")),
                _f(m["lo"]),
                _f(m["point"]),
                _f(m["hi"]),
                "—" if err is None else f"{100 * err:+.2f}%",
                {True: "yes", False: "NO", None: "—"}[m.get("covered")],
                rates,
                _share(m["shares"]["extrapolated"]),
                _share(m["unidentified"] / m["point"] if "unidentified" in m else None),
                _calibrated(e, method),
            )
        pop = e.get("population")
        truth = e["truth"]
        if pop is None:
            continue
        table.add_row(
            name,
            "population",
            f"{e['counts']['blocks']:,}",
            _f(truth),
            "",
            _f(pop["mean"]),
            "",
            "—" if truth in (None, 0) else f"{100 * (pop['mean'] / truth - 1):+.2f}%",
            "",
            "",
            "",
            "",
            "",
            end_section=True,
        )
    print_table(console, table)
    if "by" in report:
        print_table(console, _fleet_estimates(report))
    console.print(
        "[dim]walk rows: trimmed blocks only (truth = shadow ceiling of the same blocks); "
        "population: all request-steps; covered: the truth mean lies in the aggregate "
        "interval (mean lo, mean hi widened by Bennett's bound on their spread); extrapolated: the "
        "share of the point that the population model filled in past the walks; unident.: "
        "the share it filled in from cells no data identifies; calibrated: the "
        "population model's held-out check on known positions (--json for its bins)[/dim]"
    )


def _fleet_estimates(report: dict) -> Table:
    """A fleet's blended estimate (observed blocks and walks, as the live gauges) per
    workload, and per group of its `--by` keys."""
    by = report["by"]
    table = Table(title="blended estimate: observed and walked blocks", title_justify="left")
    for col in (*by, "workload", "observed", "walked", "lo", "point", "hi", "truth"):
        table.add_column(col, justify="left" if col in (*by, "workload") else "right")
    rows = [({k: "all" for k in by}, name, e) for name, e in report["workloads"].items()]
    rows += [(g, g["workload"], g) for g in report["groups"]]
    for group, name, e in rows:
        est = e.get("estimate")
        if est is None:
            continue
        table.add_row(
            *(str(group[k]) for k in by),
            str(name),
            f"{est['observed_blocks']:,}",
            f"{est['walked_blocks']:,}",
            _f(est["lo"]),
            _f(est["point"]),
            _f(est["hi"]),
            _f(e["truth"]),
        )
    return table


def _calibrated(entry: dict, method: str) -> str:
    """The sampled walk's extrapolation check (`extrapolation_check`), as yes, NO or —."""
    check = entry.get("extrapolation_check") if method == "sampled" else None
    return {True: "yes", False: "NO", None: "—"}[(check or {}).get("calibrated")]


def _share(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def print_block_accept_estimates(report: dict) -> None:
    """The sampled walk over SGLang's block-accept JSONL (`block_accept_estimates`): per
    workload, the all-steps mean ceiling, what its point is made of, and the tail model's
    footing."""
    console = make_console()
    table = Table(
        title=f"{report['source']}: sampled walk, gamma {report['gamma']} "
        "(accepted drafts per request-step)",
        title_justify="left",
    )
    cols = ("workload", "steps", "lo", "point", "hi", "interval", "observed", "walked",
            "extrap.", "unident.", "point range", "calibrated")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col == "workload" else "right")
    for name, e in report["workloads"].items():
        s = e["sampled"]
        m = s.get("all_steps", s)
        shares = m["shares"]
        cal = (e.get("tail_model") or {}).get("calibration", {}).get("calibrated")
        unident = m["unidentified"] / m["mean_point"] if m["mean_point"] else None
        table.add_row(
            name,
            f"{m.get('steps', s['blocks']):,}",
            _f(m["mean_lo"]),
            _f(m["mean_point"]),
            _f(m["mean_hi"]),
            f"[{_f(m['ci_lo'])}, {_f(m['ci_hi'])}]",
            _share(shares["observed"]),
            _share(shares["walked"]),
            _share(shares["extrapolated"]),
            _share(unident),
            f"[{_f(m['mean_point_lo'])}, {_f(m['mean_point_hi'])}]",
            {True: "yes", False: "NO", None: "—"}[cal],
        )
    print_table(console, table)
    console.print(
        "[dim]observed, walked, extrap.: shares of the point from verified windows and "
        "exact ceilings, from the walks' exact products, and from the tail model; "
        "unident.: the share extrapolated where no known position backs the model "
        "(there the point range runs to the lo/hi bracket); calibrated: the model's "
        "held-out check (--json for its bins)[/dim]"
    )
    if report["bad_lines"]:
        console.print(
            f"[yellow]{report['bad_lines']:,} bad lines skipped[/yellow] (first: "
            + "; ".join(report["bad_line_samples"][:3])
            + ")"
        )


#: Ingest error reasons that are not a rejected step, and how a person says them.
_NOT_REJECTIONS = {
    "dropped_steps": "dropped by the server before a poll read them (dropped_steps)",
    "dropped_at_stop": "taken from the server but not converted before the stop's drain "
    "ran out (dropped_at_stop)",
    "server_restart": "server restarts seen (server_restart)",
    "forward_ct_jump": "step counter jumps followed, not counted as lost (forward_ct_jump)",
    "source_failed": "source failures (source_failed)",
    "hook_failed": "observer failures inside the hook (hook_failed)",
}
#: Reasons for a poll that failed as a whole (plus http_NNN): no step was seen, none rejected.
_POLL_FAULTS = frozenset(
    ("timeout", "connect_failed", "bad_json", "oversized", "poll_failed", "clear_failed",
     "bad_envelope", "redirect_refused", "too_deep")
)  # fmt: skip


def _by_reason(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n:,}" for reason, n in sorted(counts.items()))


def ingest_outcome(ingested: int, errors: dict[str, int], dropped: dict[str, int]) -> str:
    """What became of a source's steps, in words: ingested, rejected (a broken telemetry
    invariant) and, apart, what was never a step to reject: steps the server or the hook
    dropped unread, failed polls, restarts (`dspark_ingest_errors_total` counts them all)."""
    polls = {r: n for r, n in errors.items() if r in _POLL_FAULTS or r.startswith("http_")}
    rejected = {r: n for r, n in errors.items() if r not in polls and r not in _NOT_REJECTIONS}
    parts = [f"{ingested:,} steps ingested", f"{sum(rejected.values()):,} rejected"]
    if rejected:
        parts[-1] += f" ({_by_reason(rejected)})"
    parts += [f"{errors[r]:,} {text}" for r, text in _NOT_REJECTIONS.items() if errors.get(r)]
    if polls:
        parts.append(f"{sum(polls.values()):,} failed polls ({_by_reason(polls)})")
    if any(dropped.values()):
        kept = {r: n for r, n in dropped.items() if n}
        parts.append(f"{sum(kept.values()):,} dropped before aggregation ({_by_reason(kept)})")
    return ", ".join(parts)
