"""A second implementation of the fleet figures, from the union of the runs' rows.

The commands fold each run into sums and add them; this reads every row of every run at
once (fine for test-sized runs) and computes each figure directly, in numpy and polars
expressions of its own, so a fold that dropped or double-counted anything disagrees.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dspark_obs.store.layout import in_memory

EPS = 1e-8  # SGLang's clamp of predictions


def union(runs: list[Path], table: str, nodes: list[str] | None = None) -> pl.DataFrame:
    """Every part of `table` in every run, with the run's node (default: its index)."""
    frames = []
    for i, run in enumerate(runs):
        frame = in_memory(pl.read_parquet(str(run / table / "part-*.parquet")))
        frames.append(frame.with_columns(pl.lit(nodes[i] if nodes else str(i)).alias("node")))
    return pl.concat(frames, how="diagonal_relaxed")


def stream_rate(reqs: pl.DataFrame, steps: pl.DataFrame) -> float | None:
    """Committed tokens per second of these request-steps: each (node, rank) serves beside
    the others, so its tokens over its own steps' time, added up."""
    total, timed = 0.0, False
    for (node, rank), part in reqs.group_by("node", "rank"):
        own = steps.filter((pl.col("node") == node) & (pl.col("rank") == rank))
        seconds = float(np.nansum(own["step_gpu_ms"].fill_null(np.nan).to_numpy())) / 1e3
        if seconds > 0:
            total += int(part["acc_len"].to_numpy().sum()) / seconds
            timed = True
    return total if timed else None


def summary_entry(reqs: pl.DataFrame, rate: float | None) -> dict:
    """`summary`'s entry of these request-steps: every figure straight from the rows but the
    throughput, `rate` (`stream_rate`)."""
    known = reqs.select(pl.coalesce("ceiling", "shadow_ceiling").fill_null(-1)).to_series()
    known = known.to_numpy()
    has = known >= 0
    accepted = reqs["correct_drafts"].to_numpy()
    committed = int(reqs["acc_len"].to_numpy().sum())
    steps = reqs.select("node", "rank", "forward_ct").unique().height
    return {
        "steps": steps,
        "request_steps": reqs.height,
        "mean_window": float((reqs["verify_len"].to_numpy() - 1).mean()),
        "mean_accepted": float(accepted.mean()),
        "mean_committed": committed / reqs.height,
        "mean_ceiling": float(known[has].mean()) if has.any() else None,
        "ceiling_rows": int(has.sum()),
        "utilisation": float(accepted[has].sum() / known[has].sum()) if has.any() else None,
        "trimmed_tokens": int(np.maximum(known[has] - accepted[has], 0).sum())
        if has.any()
        else None,
        "mean_verify_tokens": float(reqs["verify_len"].to_numpy().mean()),
        "committed_tokens": committed,
        "throughput_tokens_per_s": rate,
    }


def labelled(reqs: pl.DataFrame, keys: list[str]) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """Per (*keys, position): predictions and prefix labels of the labelled rows."""
    out: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for key, g in reqs.filter(pl.col("survival").is_not_null()).group_by(keys):
        surv = np.clip(g["survival"].to_numpy(), EPS, 1 - EPS)
        accepted = g["correct_drafts"].to_numpy()
        window = g["window"].to_numpy()
        ceiling = g["ceiling"].fill_null(g["shadow_ceiling"]).fill_null(-1).to_numpy()
        has = ceiling >= 0
        reach = np.where(has, ceiling, accepted)
        settled = has | (accepted < window)
        for j in range(surv.shape[1]):
            keep = settled | (j < accepted)
            if keep.any():
                out[(*key, j)] = (surv[keep, j], (j < reach)[keep])
    return out


@np.errstate(invalid="ignore", divide="ignore")  # AUROC is NaN where one label is absent
def calibration(p: np.ndarray, y: np.ndarray, ece_bin: np.ndarray, auroc_bin: np.ndarray) -> dict:
    """ECE, Brier, binned AUROC, the exact AUROC and the binned one's bound (its tied pairs)."""
    ece = sum(abs(p[ece_bin == b].sum() - y[ece_bin == b].sum()) for b in np.unique(ece_bin))
    size = int(auroc_bin.max()) + 1
    pos = np.bincount(auroc_bin[y], minlength=size)
    neg = np.bincount(auroc_bin[~y], minlength=size)
    binned = (pos * (np.cumsum(neg) - neg + 0.5 * neg)).sum() / (pos.sum() * neg.sum())
    order = np.argsort(p, kind="stable")
    ranks = np.empty(len(p))
    _, first, count = np.unique(p[order], return_index=True, return_counts=True)
    ranks[order] = np.repeat(first + (count + 1) / 2.0, count)
    n_pos, n_neg = y.sum(), (~y).sum()
    return {
        "ece": ece / len(p),
        "brier": float(((p - y) ** 2).mean()),
        "auroc": binned,
        "auroc_exact": (ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg),
        "auroc_bound": 0.5 * (pos * neg).sum() / (pos.sum() * neg.sum()),
        "count": len(p),
    }


def posthoc_calibration(p: np.ndarray, y: np.ndarray, bins: int = 15) -> dict:
    """`calibration`'s binning: `bins` equal-width ECE bins, 1,024 AUROC bins."""
    ece_bin = np.minimum((p * bins).astype(np.int64), bins - 1)
    return calibration(p, y, ece_bin, np.minimum((p * 1024).astype(np.int64), 1023))


def blended_estimate(reqs: pl.DataFrame, walks: pl.DataFrame, gamma: int, keys: list[str]):
    """Per keys: blocks a step reveals and the walks' sums, as the live estimate gauges."""
    revealed = (pl.col("correct_drafts") < pl.col("window")) | (pl.col("window") == gamma)
    observed = (
        reqs.filter(revealed)
        .group_by(keys)
        .agg(pl.len().alias("blocks"), pl.col("correct_drafts").sum().alias("tokens"))
    )
    walked = walks.group_by(keys).agg(
        pl.len().alias("walked"), pl.col("lo").sum(), pl.col("point").sum(), pl.col("hi").sum()
    )
    both = observed.join(walked, on=keys, how="full", coalesce=True).fill_null(0)
    return {tuple(r[k] for k in keys): r for r in both.iter_rows(named=True)}


def assert_same(got, want, where: str = "") -> None:
    """Equal structures, numbers to 1e-12 (relative, and absolute near zero)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (where, set(got) ^ set(want))
        for k in want:
            assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12, nan_ok=True), where
    else:
        assert got == want, where
