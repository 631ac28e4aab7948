"""Load figures: throughput against per-user speed (figures 1 and 3), budget and step time by batch.

Runs draw in `palette.series_style` (a tone, line and marker each), never in a workload's
colour; batch-size axes are ticked at the batch sizes measured.

`arms` is a list of `(label, load_curve frame)`; every arm is one line, so an
A/B (compact vs no-trim) overlays on shared axes.
"""

from __future__ import annotations

import polars as pl

from ...numbers import number
from ...palette import series_style
from ...plotting import batch_size_axis, legend_outside, new_figure


def _timed(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(pl.col("throughput_tokens_per_s").is_not_null())


def throughput_figure(arms: list[tuple[str, pl.DataFrame]]):
    """Total throughput (y) against per-user decode speed (x), one curve per arm over the sweep."""
    fig = new_figure()
    ax = fig.add_subplot()
    for k, (label, frame) in enumerate(arms):
        timed = _timed(frame)
        x, y = (
            timed["per_user_tokens_per_s"].to_numpy(),
            timed["throughput_tokens_per_s"].to_numpy(),
        )
        ax.plot(x, y, label=label, **series_style(k, len(arms)))
        for bs, xi, yi in zip(timed["bs"].to_list(), x, y, strict=True):
            if k:  # the arms share their load levels: label one curve's points
                break
            ax.annotate(
                f"bs {number(bs)}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7
            )
    ax.set_xlabel("per-user decode speed (tokens/s per request)")
    ax.set_ylabel("total throughput (tokens/s)")
    ax.set_title(
        "Throughput vs per-user speed across the concurrency sweep (up and right is better)"
    )
    legend_outside(ax, title="run")
    ax.grid(alpha=0.3)
    return fig


def _by_batch(arms, column: str, ylabel: str, title: str):
    fig = new_figure()
    ax = fig.add_subplot()
    sizes = []
    for k, (label, frame) in enumerate(arms):
        part = frame.filter(pl.col(column).is_not_null())
        style = series_style(k, len(arms))
        ax.plot(part["bs"].to_numpy(), part[column].to_numpy(), label=label, **style)
        sizes += part["bs"].to_list()
    batch_size_axis(ax, sizes)
    ax.set_xlabel("batch size (requests per step)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    legend_outside(ax, title="run")
    ax.grid(alpha=0.3)
    return fig


def budget_figure(arms: list[tuple[str, pl.DataFrame]]):
    """Scheduler budget per request (extra verify tokens) against batch size."""
    return _by_batch(
        arms,
        "budget_per_request",
        "budget per request (extra verify tokens)",
        "Verify budget per request vs batch size",
    )


def step_time_figure(arms: list[tuple[str, pl.DataFrame]]):
    """Mean measured step time against batch size."""
    return _by_batch(arms, "mean_step_ms", "mean step time (ms)", "Step time vs batch size")
