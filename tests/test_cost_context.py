"""Step cost that depends on context length: the runtime's attention term, the steps table's
context column, `cost fit`'s extended table and by-context view, and the exporter's
per-bucket counters.

Two reference runs share seed and traffic (one long-output workload, so each request's
context grows from its prompt to a thousand tokens and more) and differ only in
`context_cost`: with it, the additive table T(bs, K) must miss in a way that trends with
context and the extended table must predict held-out steps measurably better; without it,
the extension must gain nothing. Every figure is checked against numpy over the run's own
Parquet files or the StepBatches, never against the package's arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import polars as pl
import pytest

from dspark_obs.aggregates import Aggregates
from dspark_obs.analysis.cost_context import NO_CONTEXT_COLUMN, NO_CONTEXT_STEPS, _solve, _Steps
from dspark_obs.analysis.cost_fit import fit_cost_table
from dspark_obs.domain.cost_table import (
    AdditiveCostTable,
    ContextCostTable,
    load_cost_table,
)
from dspark_obs.recording.reference import record_reference_run
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.language import WorkloadProfile
from dspark_obs.store import RunWriter, open_run
from dspark_obs.store.layout import in_memory

from .conftest import cli
from .golden_outputs import RUN as GOLDEN_RUN
from .test_aggregates import parse_exposition, render
from .test_cost_fit import write_steps

CONTEXT_COST = 3e-7  # seconds per context token


def _record(path: Path, context_cost: float) -> Path:
    config = RuntimeConfig(
        seed=5,
        concurrency=[4, 64],
        steps_per_level=300,
        max_new_tokens=8192,
        context_cost=context_cost,
        workloads=[WorkloadProfile("long", peak=5.0, mean_output_len=4000.0, prompt_len=128)],
    )
    return record_reference_run(config, path, None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[float, Path]:
    root = tmp_path_factory.mktemp("context")
    return {c: _record(root / f"run-{c:g}", c) for c in (CONTEXT_COST, 0.0)}


@pytest.fixture(scope="module")
def fits(runs, tmp_path_factory) -> dict[float, dict]:
    """`cost fit --json` on both runs, as a subprocess; the written files alongside."""
    out = {}
    for c, run in runs.items():
        table = tmp_path_factory.mktemp("tables") / "table.json"
        report = json.loads(cli("cost", "fit", str(run), "--out", str(table), "--json").stdout)
        out[c] = {"report": report, "table": table, "context": Path(report["context_out"])}
    return out


def frames(run: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    return (
        pl.read_parquet(str(run / "steps" / "part-*.parquet")),
        in_memory(pl.read_parquet(str(run / "requests" / "part-*.parquet"))),
    )


def per_step_context(run: Path) -> pl.DataFrame:
    """Steps joined to their requests' prefix_len and verify_len, summed independently."""
    steps, reqs = frames(run)
    sums = reqs.group_by("rank", "forward_ct").agg(
        prefix_sum=pl.col("prefix_len").sum(),
        weighted=(pl.col("prefix_len") * (1 + pl.col("verify_len") / 64)).sum(),
        rows=pl.len(),
    )
    return steps.join(sums, on=["rank", "forward_ct"], how="left").sort("forward_ct")


def bucket_lower(mean_context: np.ndarray) -> np.ndarray:
    """0 below 64 tokens, else the power of two at or below, capped at 2**17."""
    with np.errstate(divide="ignore"):
        power = np.floor(np.log2(np.maximum(mean_context, 1.0)))
    lower = np.where(mean_context < 64, 0, 2.0 ** np.minimum(power, 17))
    return lower.astype(np.int64)


# ---------------------------------------------------------------- runtime and store


def test_steps_record_their_requests_context(runs):
    joined = per_step_context(runs[CONTEXT_COST])
    assert joined["context_tokens"].null_count() == 0
    assert joined["context_tokens"].to_list() == joined["prefix_sum"].to_list()
    mean = (joined["context_tokens"] / joined["bs"]).to_numpy()
    assert mean.max() > 4 * mean.min()  # the traffic's context grows


def test_sglang_ingested_steps_record_their_context(tmp_path):
    """SGLang gives prefix_len per request with the reqs component; ingest carries it."""
    payload = Path(__file__).parent / "data" / "sglang" / "server_info.compact.sampled.json"
    cli("ingest", str(payload), "--out", str(tmp_path / "ing"))
    joined = per_step_context(tmp_path / "ing")
    assert joined.height > 0 and joined["context_tokens"].null_count() == 0
    assert joined["context_tokens"].to_list() == joined["prefix_sum"].to_list()


def test_context_cost_adds_attention_over_each_requests_context(runs):
    """Same seed: the same tokens and the same noise draws, so the ratio of the two runs'
    step times is (table + attention) / table exactly, attention from the Parquet rows."""
    a, b = per_step_context(runs[CONTEXT_COST]), per_step_context(runs[0.0])
    assert a["num_verify_tokens"].to_list() == b["num_verify_tokens"].to_list()
    manifest = json.loads((runs[CONTEXT_COST] / "run.json").read_text())
    assert manifest["config"]["context_cost"] == CONTEXT_COST
    table = AdditiveCostTable(**manifest["cost_table"])
    bs = a["bs"].to_numpy()
    base = table.step_seconds(bs, a["num_verify_tokens"].to_numpy() - bs)
    attention = CONTEXT_COST * a["weighted"].to_numpy()
    ratio = a["step_gpu_ms"].to_numpy() / b["step_gpu_ms"].to_numpy()
    np.testing.assert_allclose(ratio, 1 + attention / base, rtol=1e-9)
    assert (attention / base).max() > 0.3  # a term that matters


def test_negative_context_cost_is_refused(tmp_path):
    proc = cli("run", "--out", str(tmp_path / "r"), "--context-cost=-1e-7", check=False)
    assert proc.returncode != 0
    assert "context cost must be finite and >= 0" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- cost fit


def test_extended_fit_predicts_held_out_steps_better(fits):
    ctx = fits[CONTEXT_COST]["report"]["fit"]["context"]
    add, ext = ctx["held_out"]["additive"], ctx["held_out"]["extended"]
    assert add["steps"] == ext["steps"] > 250
    assert ext["rel_error_mean"] < 0.5 * add["rel_error_mean"]
    assert ext["rms_seconds"] < 0.5 * add["rms_seconds"]
    assert ext["r2"] > add["r2"]
    # attention reads each context token once, plus a verify block's share of a 64-row tile
    assert CONTEXT_COST < ctx["context_seconds_per_token"] < CONTEXT_COST * (1 + 8 / 64) * 1.1


def test_without_context_cost_the_extension_gains_nothing(fits):
    ctx = fits[0.0]["report"]["fit"]["context"]
    add, ext = ctx["held_out"]["additive"], ctx["held_out"]["extended"]
    assert abs(ext["rel_error_mean"] - add["rel_error_mean"]) < 0.05 * add["rel_error_mean"]
    assert abs(ctx["context_seconds_per_token"]) < 0.02 * CONTEXT_COST


def test_by_context_view_shows_the_additive_tables_trend(runs, fits):
    """Recomputed from the steps and the two written tables: the additive table is
    optimistic at long context and pessimistic at short; the extended one is neither."""
    fit = fits[CONTEXT_COST]
    buckets = fit["report"]["fit"]["context"]["by_context"]
    steps = per_step_context(runs[CONTEXT_COST])
    steps = steps.filter(steps["step_gpu_ms"].is_not_null())
    bs, m = steps["bs"].to_numpy(), steps["num_verify_tokens"].to_numpy()
    context = steps["context_tokens"].to_numpy()
    y = steps["step_gpu_ms"].to_numpy() / 1e3
    additive = load_cost_table(fit["table"]).step_seconds(bs, m - bs)
    written = json.loads(fit["context"].read_text())
    per_token = written["context_seconds_per_token"]
    extended = AdditiveCostTable(**written["additive"]).step_seconds(bs, m - bs) + (
        per_token * context
    )
    assert msgspec.json.decode(fit["context"].read_bytes(), type=ContextCostTable).step_seconds(
        bs, m - bs, context
    ) == pytest.approx(extended, rel=1e-12)
    lower = bucket_lower(context / bs)
    assert [b["context"] for b in buckets] == sorted(set(lower.tolist()))
    for b in buckets:
        sel = lower == b["context"]
        assert b["steps"] == int(sel.sum())
        assert b["mean_context"] == pytest.approx((context / bs)[sel].mean(), rel=1e-12)
        rel_a, rel_e = ((y - f)[sel] / y[sel] for f in (additive, extended))
        assert b["additive_rel_bias"] == pytest.approx(rel_a.mean(), rel=1e-9, abs=1e-12)
        assert b["additive_rel_error"] == pytest.approx(np.abs(rel_a).mean(), rel=1e-9)
        assert b["extended_rel_bias"] == pytest.approx(rel_e.mean(), rel=1e-9, abs=1e-12)
        assert b["extended_rel_error"] == pytest.approx(np.abs(rel_e).mean(), rel=1e-9)
    big = [b for b in buckets if b["steps"] >= 30]
    assert len(big) >= 3
    trend = [b["additive_rel_bias"] for b in big]
    assert trend == sorted(trend) and trend[0] < -0.1 and trend[-1] > 0.1
    assert all(abs(b["extended_rel_bias"]) < 0.02 for b in big)


def test_cell_sums_give_the_per_step_least_squares(runs):
    """The context term fitted from (bs, M-bin) cell sums predicts exactly as a per-step
    numpy lstsq over the same design rows."""
    steps = per_step_context(runs[CONTEXT_COST])
    bs, m = steps["bs"].to_numpy(), steps["num_verify_tokens"].to_numpy()
    context = steps["context_tokens"].to_numpy().astype(np.float64)
    s = _Steps(bs, m // 64, context, steps["step_gpu_ms"].to_numpy() / 1e3)
    bs_p, m_p = (1, 8, 32, 64), (64, 128, 256, 512)
    coef, _ = _solve(s, bs_p, m_p, True)

    def hat(x, probes):
        return np.stack(
            [np.interp(x, probes, np.eye(len(probes))[k]) for k in range(len(probes))], 1
        )

    design = np.hstack(
        [np.ones((len(bs), 1)), hat(bs, bs_p), hat((m // 64 + 0.5) * 64, m_p), s.context[:, None]]
    )
    direct, *_ = np.linalg.lstsq(design, s.y, rcond=None)
    np.testing.assert_allclose(design @ coef, design @ direct, rtol=1e-9)


def test_sglangs_table_file_stays_sglangs_and_the_extension_has_its_own(fits, tmp_path, runs):
    fit = fits[CONTEXT_COST]
    assert set(json.loads(fit["table"].read_text())) == set(AdditiveCostTable.__struct_fields__)
    assert fit["context"] == fit["table"].with_name("table.context.json")
    assert fit["report"]["context_table"] == json.loads(fit["context"].read_text())
    # `--context-out` names the file; the terminal view names both tables' figures
    out, other = tmp_path / "t.json", tmp_path / "elsewhere.json"
    proc = cli(
        "cost", "fit", str(runs[CONTEXT_COST]), "--out", str(out), "--context-out", str(other)
    )
    assert other.exists() and not out.with_name("t.context.json").exists()
    assert "step-cost error by context length" in proc.stdout
    assert "with context" in proc.stdout


def test_runs_without_the_column_or_without_rows_still_fit(tmp_path):
    out = tmp_path / "t.json"
    report = json.loads(cli("cost", "fit", str(GOLDEN_RUN), "--out", str(out), "--json").stdout)
    assert report["fit"]["context"] is None
    assert report["fit"]["context_missing"] == NO_CONTEXT_COLUMN
    assert report["context_out"] is None and not out.with_name("t.context.json").exists()
    assert load_cost_table(out).bias_seconds > 0
    # steps without request rows: the column exists, all null
    steps = [(bs, m, 5.0 + bs / 10 + m / 100, None) for bs in (1, 8, 32) for m in (64, 200, 400)]
    run = write_steps(tmp_path / "stepsonly", steps)
    assert pl.read_parquet(str(run / "steps" / "*.parquet"))["context_tokens"].null_count() == 9
    fit = fit_cost_table(open_run(run))
    assert fit.context is None and fit.context_missing == NO_CONTEXT_STEPS


# ---------------------------------------------------------------- exporter


def test_exporter_counters_by_context_bucket(runs):
    """The six per-bucket counters against a loop over the same StepBatches."""
    batches = list(open_run(runs[CONTEXT_COST]).batches())
    agg = Aggregates(batches[0].gamma)
    for b in batches:
        agg.update(b)
    samples, types = parse_exposition(render(agg.snapshot()))
    want: dict[int, np.ndarray] = {}
    for b in batches:
        mean = float(np.mean(b.prefix_len))
        p, y = b.predicted_step_ms / 1e3, b.step_gpu_ms / 1e3
        row = np.array([1, p, y, (y - p) ** 2, abs(y - p) / y, mean])
        lower = int(bucket_lower(np.array([mean]))[0])
        want[lower] = want.get(lower, 0) + row
    assert len(want) >= 3
    names = ("steps", "predicted_seconds", "measured_seconds", "squared_error", "relative_error")
    for i, name in enumerate((*names, "tokens")):
        family = f"dspark_cost_model_context_{name}_total"
        assert types[family] == "counter"
        got = samples[family]
        assert len(got) == len(want), family
        for lower, row in want.items():
            key = frozenset({("mode", "compact"), ("rank", "0"), ("context", str(lower))})
            assert got[key] == pytest.approx(row[i], rel=1e-9), (family, lower)


def test_negative_prefix_lengths_are_left_out_not_fatal(runs, tmp_path):
    """prefix_len arrives unchecked from SGLang: a step whose context sums below 0 is a
    recording error, left out of the fit's context view and the exporter's buckets."""
    source = open_run(runs[CONTEXT_COST])
    batches = list(source.batches())
    for b in batches[::3]:
        b.prefix_len = -b.prefix_len - 1
    bad = len(batches[::3])
    with RunWriter(tmp_path / "bad", source.manifest) as w:
        for b in batches:
            w.append(b)
    fit = fit_cost_table(open_run(tmp_path / "bad"))
    assert fit.context is not None and fit.context.steps == len(batches) - bad
    agg = Aggregates(batches[0].gamma)
    for b in batches:
        agg.update(b)
    samples, _ = parse_exposition(render(agg.snapshot()))
    counted = sum(samples["dspark_cost_model_context_steps_total"].values())
    assert counted == len(batches) - bad
