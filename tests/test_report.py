"""`dspark-obs report`, driven as a user drives it, its numbers recomputed independently.

Each table of `summary.md` is parsed back and compared with the same figure
computed here from the run's Parquet files by a different route: SQL in DuckDB
for means, shares, throughput and trim loss, and the numpy calibration
accumulator (itself checked against torchmetrics elsewhere) for ECE, Brier and
AUROC. Every PNG must exist, decode and not be blank. The SGLang case is a run
ingested from a documented `/server_info` payload (no shadow, no logits, no
step times): the report must still be written, and say what is missing.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import duckdb
import matplotlib.image
import numpy as np
import polars as pl
import pytest

from dspark_obs.calibration import CalibrationAccumulator, prefix_labels
from dspark_obs.numbers import delta
from dspark_obs.store import open_run
from dspark_obs.store.layout import in_memory
from dspark_obs.whatif.predict import whatif
from dspark_obs.whatif.trim_cost import TRIM_COST_KEYS, trim_cost

from .conftest import SMALL_RUN, cli

SGLANG_DUMP = Path(__file__).parent / "data" / "sglang" / "server_info.compact.sampled.json"


def parse_tables(markdown: str) -> dict[str, list[dict[str, str]]]:
    """`### title` followed by a pipe table -> list of row dicts, keyed by title."""
    tables: dict[str, list[dict[str, str]]] = {}
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("### "):
            continue
        header = [c.strip() for c in lines[i + 2].strip("|").split("|")]
        rows = []
        for row in lines[i + 4 :]:
            if not row.startswith("|"):
                break
            rows.append(
                dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True))
            )
        tables[line[4:]] = rows
    return tables


def num(text: str) -> float | None:
    text = text.split(" [")[0]
    return None if text == "—" else float(text.replace(",", ""))


def bracket(text: str) -> tuple[float, float]:
    lo, hi = re.search(r"\[([^,]+), ([^\]]+)\]", text).groups()
    return float(lo.replace(",", "")), float(hi.replace(",", ""))


def span(text: str) -> tuple[float, float]:
    """`lo – hi` (numbers with thousands separators) as two floats."""
    lo, hi = text.split(" – ")
    return float(lo.replace(",", "")), float(hi.replace(",", ""))


def sql(run: Path, query: str) -> list[tuple]:
    con = duckdb.connect()
    for table in ("steps", "requests", "ceilings"):
        if (run / table).is_dir():
            con.execute(
                f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{run / table}/*.parquet')"
            )
    return con.execute(query).fetchall()


def assert_png_ok(path: Path) -> None:
    pixels = matplotlib.image.imread(path)[..., :3]
    assert pixels.shape[0] >= 250 and pixels.shape[1] >= 500, (path.name, pixels.shape)
    assert pixels.std() > 0.02, f"{path.name} looks blank"


@pytest.fixture(scope="module")
def static_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "static"
    cli("run", "--mode", "static", "--out", str(out), *SMALL_RUN)
    return out


@pytest.fixture(scope="module")
def report(compact_run, static_run, tmp_path_factory):
    run, _ = compact_run
    out = tmp_path_factory.mktemp("report")
    proc = cli(
        "report", "--arms", str(run), str(static_run), "--out", str(out), "--top", "5", "--quiet"
    )
    return run, static_run, out, proc, parse_tables((out / "summary.md").read_text())


def test_outputs_exist_and_every_figure_is_drawn(report):
    _, _, out, proc, _ = report
    pngs = sorted(out.glob("*.png"))
    # 2 workload + 3 load, then per run 1 policies, 2 calibration, 3 cost, 2 estimator and
    # 2 drill-down figures, except that static never trims, so it has no drill-down
    assert len(pngs) == 5 + 10 + 8, [p.name for p in pngs]
    assert pngs[0].name == f"0.01-policies-{report[0].name}.png"  # the first section's
    for png in pngs:
        assert_png_ok(png)
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(pngs)
    assert 'src="http' not in page and "<script" not in page  # opens offline
    assert "report.html" in proc.stdout and "per workload" in proc.stdout


def test_workload_table_equals_sql(report):
    run, _, _, _, tables = report
    rows = {r["workload"]: r for r in tables[f"{run.name}: per workload"]}
    expected = sql(
        run,
        """SELECT workload, count(*), avg("window"), avg(correct_drafts), avg(acc_len),
                  avg(coalesce(ceiling, shadow_ceiling)),
                  sum(correct_drafts) FILTER (WHERE coalesce(ceiling, shadow_ceiling) IS NOT NULL)
                    / sum(coalesce(ceiling, shadow_ceiling))
           FROM requests GROUP BY workload ORDER BY workload""",
    )
    assert sorted(rows) == [e[0] for e in expected]
    for name, n, window, accepted, committed, ceiling, util in expected:
        r = rows[name]
        assert num(r["request-steps"]) == n
        for key, value in (
            ("window", window),
            ("accepted", accepted),
            ("committed", committed),
            ("ceiling (observed)", ceiling),
            ("utilisation", util),
        ):
            assert num(r[key]) == pytest.approx(value, abs=5e-4), (name, key)
        lo, hi = bracket(r["ceiling (walk) [lo, hi]"])
        assert lo - 5e-4 <= num(r["ceiling (walk) [lo, hi]"]) <= hi + 5e-4


def test_window_shares_equal_sql(report):
    run, _, _, _, tables = report
    rows = tables[f"{run.name}: share of request-steps at each verify window"]
    counts = sql(run, 'SELECT workload, "window", count(*) FROM requests GROUP BY ALL')
    totals: dict[str, int] = {}
    for w, _, c in counts:
        totals[w] = totals.get(w, 0) + c
    share = {(w, k): c / totals[w] for w, k, c in counts}
    for r in rows:
        for k in range(8):
            assert num(r[str(k)]) == pytest.approx(share.get((r["workload"], k), 0.0), abs=5e-5)


def test_load_table_equals_sql(report):
    run, _, _, _, tables = report
    rows = {int(num(r["bs"])): r for r in tables[f"{run.name}: load levels"]}
    expected = sql(
        run,
        """WITH c AS (SELECT rank, forward_ct, sum(acc_len) AS committed FROM requests GROUP BY ALL)
           SELECT s.bs, count(*), sum(c.committed) / (sum(s.step_gpu_ms) / 1000),
                  sum(c.committed) / (sum(s.step_gpu_ms * s.bs) / 1000),
                  sum(s.budget) / sum(s.bs), avg(s.step_gpu_ms)
           FROM steps s JOIN c USING (rank, forward_ct) WHERE s.bs > 0 GROUP BY s.bs""",
    )
    assert sorted(rows) == sorted(e[0] for e in expected)
    for bs, steps, throughput, per_user, budget, step_ms in expected:
        r = rows[bs]
        assert num(r["steps"]) == steps
        assert num(r["throughput tok/s"]) == pytest.approx(throughput, abs=0.5)
        assert num(r["per-user tok/s"]) == pytest.approx(per_user, abs=0.05)
        assert num(r["budget/request"]) == pytest.approx(budget, abs=5e-4)
        assert num(r["step ms"]) == pytest.approx(step_ms, abs=5e-3)


def test_calibration_table_equals_numpy_accumulator(report):
    run, _, _, _, tables = report
    rows = tables[f"{run.name}: calibration per position"]
    df = in_memory(pl.read_parquet(run / "requests" / "*.parquet"))
    known = df.select(pl.coalesce("ceiling", "shadow_ceiling").fill_null(-1)).to_series()
    labels, labelled = prefix_labels(
        df["correct_drafts"].to_numpy(), df["window"].to_numpy(), known.to_numpy(), 7
    )
    after = CalibrationAccumulator(7).update(df["survival"].to_numpy(), labels, labelled).compute()
    raw = 1.0 / (1.0 + np.exp(-df["confidence_logits"].to_numpy()))
    before = CalibrationAccumulator(7).update(np.cumprod(raw, axis=1), labels, labelled).compute()
    assert len(rows) == 7
    for r, a, b in zip(rows, after, before, strict=True):
        assert num(r["rows"]) == a["count"]
        assert num(r["ECE after"]) == pytest.approx(a["ece"], abs=5e-5)
        assert num(r["Brier after"]) == pytest.approx(a["brier"], abs=5e-5)
        assert num(r["AUROC after"]) == pytest.approx(a["auroc"], abs=5e-5)
        assert num(r["ECE before"]) == pytest.approx(b["ece"], abs=5e-5)
        assert num(r["observed"]) == pytest.approx(a["target_mean"], abs=5e-5)
    # STS is fitted on a warm-up, so it should help on the run itself too
    assert sum(x["ece"] for x in after) < sum(x["ece"] for x in before)


def test_drill_down_equals_sql(report):
    run, _, _, _, tables = report
    rows = tables[f"{run.name}: top 5 requests by trim loss"]
    expected = sql(
        run,
        """SELECT rid, sum(greatest(coalesce(ceiling, shadow_ceiling) - correct_drafts, 0)) AS loss,
                  count(*), sum(acc_len)
           FROM requests GROUP BY rid ORDER BY loss DESC, rid LIMIT 5""",
    )
    assert [r["rid"] for r in rows] == [e[0] for e in expected]
    for r, (_, loss, steps, committed) in zip(rows, expected, strict=True):
        assert num(r["trim loss"]) == pytest.approx(loss)
        assert num(r["steps"]) == steps and num(r["committed"]) == committed


def test_estimator_table_matches_estimate_command(report):
    run, _, _, _, tables = report
    est = json.loads(cli("estimate", str(run), "--json").stdout)
    rows = tables[f"{run.name}: estimated vs true ceiling"]
    for r in rows:
        e = est["workloads"][r["workload"]]
        if r["method"] == "population":
            assert num(r["point"]) == pytest.approx(e["population"]["mean"], abs=5e-4)
            assert num(r["truth"]) == pytest.approx(e["truth"], abs=5e-4)
        else:
            m = e[r["method"].split()[0]]
            assert num(r["blocks"]) == m["blocks"]
            assert num(r["point"]) == pytest.approx(m["point"], abs=5e-4)
            assert num(r["truth"]) == pytest.approx(m["truth"], abs=5e-4)


def test_static_arm_has_observed_ceiling_and_no_trim(report):
    _, static, out, _, tables = report
    assert f"{static.name}: no trimmed request-step" in (out / "summary.md").read_text()
    rows = tables[f"{static.name}: per workload"]
    for r in rows:
        assert num(r["window"]) == 7.0
        assert num(r["ceiling (observed)"]) == pytest.approx(num(r["accepted"]), abs=5e-4)
        assert num(r["utilisation"]) == 1.0


def test_sglang_ingested_run_reports_what_is_missing(tmp_path):
    run = tmp_path / "ingested"
    cli("ingest", str(SGLANG_DUMP), "--out", str(run))
    out = tmp_path / "report"
    proc = cli("report", str(run), "--out", str(out), "--quiet")
    summary = (out / "summary.md").read_text()
    for needle in (
        "no step times",
        "no raw confidence logits",
        "no shadow truth",
        "ingested: nothing predicted: ",  # no cost table, no step times to fit one
        "ingested: cost of trimming not predicted",
    ):
        assert needle in summary, needle
    assert "missing" in proc.stdout
    for png in out.glob("*.png"):
        assert_png_ok(png)
    tables = parse_tables(summary)
    rows = tables["ingested: per workload"]
    (n,) = sql(run, "SELECT count(*) FROM requests")[0]
    assert sum(num(r["request-steps"]) for r in rows) == n


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    proc = cli("report", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "no such run directory" in proc.stderr


def test_cost_of_trimming_equals_whatif_trim_cost(report):
    """The headline, report.json and the table carry `whatif.trim_cost` of the run, computed
    here in process; its trimmed drafts are the shadow's ceiling minus accepted (SQL)."""
    run, _, out, _, tables = report
    entries = trim_cost(open_run(run))
    assert {e["level"] for e in entries} == {4, 32}
    js = json.loads((out / "report.json").read_text())[run.name]
    assert js["whatif_missing"] is None
    got = js["whatif"]["trim_cost"]
    assert len(got) == len(entries)
    for g, e in zip(got, entries, strict=True):
        assert tuple(g) == TRIM_COST_KEYS
        for key in TRIM_COST_KEYS:
            assert g[key] == (pytest.approx(e[key], rel=1e-9) if key not in ("level", "workload")
                              else e[key]), key  # fmt: skip
        assert g["net_tokens_per_s"] == pytest.approx(g["step_time_saved"] + g["accepted_lost"])
        assert g["net_lo"] <= g["net_tokens_per_s"] <= g["net_hi"]
    trimmed = {
        (bs, w): gap
        for bs, w, gap in sql(
            run,
            """SELECT s.bs, r.workload, avg(r.shadow_ceiling - r.correct_drafts)
               FROM requests r JOIN steps s USING (rank, forward_ct) WHERE s.bs > 0
               GROUP BY ALL""",
        )
    }
    rows = tables[f"{run.name}: cost of trimming against static"]
    assert len(rows) == len(entries)
    for r, e in zip(rows, entries, strict=True):
        assert (num(r["bs"]), r["workload"]) == (e["level"], e["workload"])
        keys = ("net tokens/s", "step time saved tok/s", "accepted lost tok/s")
        net, saved, lost = (num(r[k]) for k in keys)
        assert net == pytest.approx(e["net_tokens_per_s"], abs=0.051)
        assert net == pytest.approx(saved + lost, abs=0.11)  # each shown to 0.1
        assert span(r["interval"]) == pytest.approx((e["net_lo"], e["net_hi"]), abs=0.051)
        if e["workload"] != "all":
            expect = trimmed[(e["level"], e["workload"])]
            assert num(r["trimmed/req-step"]) == pytest.approx(expect, abs=5e-4)
    assert any(e["net_tokens_per_s"] > 0 for e in entries)  # trimming paid at bs 32
    md = (out / "summary.md").read_text()
    page = (out / "report.html").read_text()
    top = md[: md.index("\n## ")]  # the header, above every section
    for e in entries:
        if e["workload"] == "all":
            shown = f"bs {e['level']}: {delta(e['net_tokens_per_s'], 1)} tokens/s"
            assert shown in top and shown in page, shown
    assert f"{run.name}: cost of trimming, net tokens/s" in top


def _crossed(ys, base) -> bool:
    """A sign change among the levels where the two differ by more than 0.01 %."""
    d = [y / b - 1 for y, b in zip(ys, base, strict=True)]
    return any(a * b < 0 for a, b in itertools.pairwise(x for x in d if abs(x) > 1e-4))


def _note_after(markdown: str, title: str) -> str:
    """The note under the table `### title`: the first text line after its rows."""
    lines = markdown[markdown.index(f"### {title}\n") :].splitlines()[1:]
    return next(line for line in lines if line and not line.startswith("|"))


def test_policy_table_and_crossings_equal_whatif(report):
    run, static_run, out, _, tables = report
    md = (out / "summary.md").read_text()
    for path, sps in ((run, []), (static_run, ["sps"])):  # a compact run's own is its sps
        (mean,) = sql(path, 'SELECT avg("window") FROM requests')[0]
        fixed = f"window={min(max(1, round(mean)), 6)}"  # the run's mean window, below gamma
        policies = ["own", "static", *sps, "sps:scale=0.5", "sps:sts=none", fixed]
        cells = [c for c in whatif(open_run(path), policies)["cells"] if c["workload"] == "all"]
        rows = tables[f"{path.name}: predicted throughput by policy"]
        assert [(r["policy"], num(r["bs"])) for r in rows] == [
            (c["policy"], c["level"]) for c in cells
        ]
        static = {c["level"]: c["tokens_per_s"] for c in cells if c["policy"] == "static"}
        for r, c in zip(rows, cells, strict=True):
            assert num(r["tokens/s"]) == pytest.approx(c["tokens_per_s"], abs=0.51)
            assert span(r["interval"]) == pytest.approx(
                (c["tokens_per_s_lo"], c["tokens_per_s_hi"]), abs=0.51
            )
            rel = 100 * (c["tokens_per_s"] / static[c["level"]] - 1)
            assert num(r["vs static %"]) == pytest.approx(rel, abs=0.0051)
        md_note = _note_after(md, f"{path.name}: cost of trimming against static")
        crossing = []
        for p in ["own", *policies[2:]]:
            ys = [c["tokens_per_s"] for c in cells if c["policy"] == p]
            levels = [c["level"] for c in cells if c["policy"] == p]
            if _crossed(ys, [static[lv] for lv in levels]):
                crossing.append("this run" if p == "own" else p)
        if crossing:
            assert all(f"{p} at about bs " in md_note for p in crossing), md_note
        else:
            assert "No policy's curve crosses static's" in md_note


def test_a_run_above_the_whatif_limit_is_left_to_whatif(compact_run, monkeypatch):
    from dspark_obs.report import arms

    run = open_run(compact_run[0])
    n = run.requests().select(pl.len()).collect().item()
    assert arms.too_large_for_whatif(run) is None
    monkeypatch.setattr(arms, "WHATIF_MAX_REQUEST_STEPS", n - 1)
    arm = arms.analyse("compact", run, 3)
    arms.predict_policies(arm)
    assert arm.whatif is None
    assert arm.whatif_missing.startswith(f"{n:,} request-steps, more than the {n - 1:,}")
    assert f"dspark-obs whatif {run.path}" in arm.whatif_missing
