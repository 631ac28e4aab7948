"""Which requests did trimming cost the most? The report's per-request drill-down.

Trim loss of a request-step is what full verification would have accepted
beyond what the window accepted: `ceiling - accepted`, zero whenever the
window was not the binding limit. The ceiling comes from the best source at
hand, per row: observed (static, cap-accept), the cap-accept shadow twin, the
exact value `accepted` when the window was not fully accepted, or else the
tail walk's point estimate. A trimmed row no walk covered has no ceiling; its
request's loss is then a lower bound and `unknown_steps` says how many rows.
"""

from __future__ import annotations

import polars as pl

from ..store import Run


def _ceiling(gamma: int, walked: bool) -> pl.Expr:
    trimmed = (pl.col("correct_drafts") == pl.col("window")) & (pl.col("window") < gamma)
    exact = pl.when(~trimmed).then(pl.col("correct_drafts").cast(pl.Float64))
    sources = [pl.col("ceiling"), pl.col("shadow_ceiling"), exact]
    if walked:
        sources.append(pl.col("walk_point"))
    return pl.coalesce(*(s.cast(pl.Float64) for s in sources))


def request_steps_with_ceiling(run: Run, blocks: pl.LazyFrame | None) -> pl.LazyFrame:
    """Request-steps with `ceiling_best` (null where unknown); joins walks only if needed."""
    gamma = run.gamma
    req = run.requests()
    missing = req.select(
        (
            pl.coalesce("ceiling", "shadow_ceiling").is_null()
            & (pl.col("correct_drafts") == pl.col("window"))
            & (pl.col("window") < gamma)
        ).any()
    ).collect()
    walked = bool(missing.item()) and blocks is not None and bool(blocks.collect_schema().names())
    if walked:
        assert blocks is not None
        keys = ["rank", "forward_ct", "rid"]
        req = req.join(
            blocks.select(*keys, pl.col("point").alias("walk_point")), on=keys, how="left"
        )
    return req.with_columns(_ceiling(gamma, walked).alias("ceiling_best"))


def trimmed_with_ceiling(rows: pl.LazyFrame, gamma: int) -> int:
    """Trimmed request-steps whose ceiling is known or estimated: zero means no loss is visible."""
    trimmed = (pl.col("correct_drafts") == pl.col("window")) & (pl.col("window") < gamma)
    return int(rows.select((trimmed & pl.col("ceiling_best").is_not_null()).sum()).collect().item())


def top_requests(rows: pl.LazyFrame, top: int) -> pl.DataFrame:
    """The `top` requests by total trim loss, with what they committed and could have."""
    loss = (pl.col("ceiling_best") - pl.col("correct_drafts")).clip(lower_bound=0)
    return (
        rows.group_by("rid")
        .agg(
            pl.col("workload").first(),
            pl.len().alias("steps"),
            pl.col("acc_len").sum().alias("committed"),
            pl.col("window").mean().alias("mean_window"),
            pl.col("correct_drafts").mean().alias("mean_accepted"),
            pl.col("ceiling_best").mean().alias("mean_ceiling"),
            loss.sum().alias("trim_loss"),
            pl.col("ceiling_best").sum().alias("_ceiling_sum"),
            pl.col("ceiling_best").is_null().sum().alias("unknown_steps"),
        )
        .with_columns(
            (pl.col("trim_loss") / pl.col("_ceiling_sum")).alias("loss_share"),
        )
        .drop("_ceiling_sum")
        .sort(["trim_loss", "rid"], descending=[True, False])
        .head(top)
        .collect()
    )


def request_traces(rows: pl.LazyFrame, rids: list[str]) -> pl.DataFrame:
    """Step-by-step window, accepted and ceiling of the given requests, in decode order."""
    return (
        rows.filter(pl.col("rid").is_in(rids))
        .select("rid", "workload", "prefix_len", "window", "correct_drafts", "ceiling_best")
        .sort("rid", "prefix_len")
        .collect()
    )
