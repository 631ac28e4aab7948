"""The CLI as a user drives it: real subprocesses, real run directories, real Parquet."""

import json

import duckdb
import numpy as np
import polars as pl
import pytest

from dspark_obs.calibration import load_sts

from .conftest import SMALL_RUN, cli


def test_run_writes_a_complete_run_dir(compact_run):
    out, summary = compact_run
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["complete"] is True
    assert manifest["mode"] == "compact" and manifest["shadow"] == "cap-accept"
    assert manifest["timing"] == "simulated" and manifest["gamma"] == 7
    assert manifest["workloads"] == ["gsm8k", "arena", "poetry"]
    assert len(manifest["sts"]["temperatures"]) == 7
    assert set(manifest["cost_table"]) == {
        "bias_seconds",
        "bs_probes",
        "alpha_seconds",
        "m_probes",
        "theta_seconds",
    }
    assert manifest["steps"] == 120 == summary["overall"]["steps"]
    assert load_sts(out / "sts.json").temperatures == manifest["sts"]["temperatures"]


def test_summary_json_equals_an_independent_sql_computation(compact_run):
    out, summary = compact_run
    again = json.loads(cli("summary", str(out), "--json").stdout)
    assert again == summary
    q = duckdb.sql(f"""
        select workload, count(*) n, avg(verify_len - 1) w, avg(correct_drafts) a,
               avg(acc_len) c, avg(shadow_ceiling) ceil,
               sum(correct_drafts) / sum(shadow_ceiling) util, sum(acc_len) tokens
        from '{out}/requests/*.parquet' group by workload
    """).fetchall()
    seconds = duckdb.sql(f"select sum(step_gpu_ms) / 1000 from '{out}/steps/*.parquet'").fetchall()[
        0
    ][0]
    assert {r[0] for r in q} == set(summary["workloads"])
    for name, n, w, a, c, ceil, util, tokens in q:
        e = summary["workloads"][name]
        assert e["request_steps"] == n
        assert e["mean_window"] == pytest.approx(w)
        assert e["mean_accepted"] == pytest.approx(a)
        assert e["mean_committed"] == pytest.approx(c)
        assert e["mean_ceiling"] == pytest.approx(ceil)
        assert e["utilisation"] == pytest.approx(util)
        assert e["ceiling_source"] == "shadow"
        assert e["throughput_tokens_per_s"] == pytest.approx(tokens / seconds)
    steps = pl.read_parquet(out / "steps" / "*.parquet")
    assert summary["overall"]["verify_tokens_per_step"] == pytest.approx(
        steps["num_verify_tokens"].mean()
    )
    for row in summary["load"]:
        sel = steps.filter(pl.col("bs") == row["bs"])
        assert row["budget_per_request"] == pytest.approx((sel["budget"] / sel["bs"]).mean())


def test_summary_table_is_readable(compact_run):
    out, _ = compact_run
    text = cli("summary", str(out)).stdout
    for word in (
        "gsm8k",
        "arena",
        "poetry",
        "overall",
        "window",
        "ceiling",
        "util",
        "budget per request",
    ):
        assert word in text


def test_static_and_cap_accept_report_observed_ceilings(tmp_path):
    for mode in ("static", "cap-accept"):
        s = json.loads(
            cli("run", "--mode", mode, "--out", str(tmp_path / mode), "--json", *SMALL_RUN).stdout
        )
        assert s["overall"]["ceiling_source"] == "observed"
        if mode == "static":
            assert s["overall"]["mean_window"] == 7
            assert s["overall"]["utilisation"] == 1.0


def test_sts_fit_from_a_run_and_run_with_it(compact_run, tmp_path):
    out, _ = compact_run
    sts = tmp_path / "sts.json"
    proc = cli("sts", "fit", str(out), "--out", str(sts))
    assert "ECE before" in proc.stdout
    cal = load_sts(sts)
    assert len(cal.temperatures) == 7 and all(t > 0 for t in cal.temperatures)
    assert np.mean(cal.ece_after) < np.mean(cal.ece_before)
    s = json.loads(
        cli("run", "--sts", str(sts), "--out", str(tmp_path / "again"), "--json", *SMALL_RUN).stdout
    )
    manifest = json.loads((tmp_path / "again" / "run.json").read_text())
    assert manifest["sts"]["temperatures"] == cal.temperatures
    assert s["overall"]["request_steps"] > 0


def test_demo_runs_and_prints_the_summary(tmp_path):
    proc = cli(
        "demo",
        "--out",
        str(tmp_path / "demo"),
        "--concurrency",
        "8,64",
        "--steps-per-level",
        "40",
        "--quiet",
    )
    assert "cap-accept shadow" in proc.stdout and "utilisation" in proc.stdout
    assert (tmp_path / "demo" / "run.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["summary", "/nonexistent/run"], "/nonexistent/run"),
        (["run", "--workloads", "gsm8k,limericks"], "neither a preset"),
        (["run", "--mode", "compact", "--shadow", "cap-accept", "--gamma", "0"], "gamma"),
        (["run", "--mode", "static", "--shadow", "cap-accept"], "compact"),
        (["run", "--mix", "1,2"], "mix weights"),
        (["run", "--sts", "/nonexistent/sts.json"], "sts.json"),
        (["run", "--cost-table", "/nonexistent/table.json"], "table.json"),
        (["run", "--temperature", "-1"], "temperature"),
    ],
)
def test_bad_input_gives_a_clear_error_and_exit_2(args, message, tmp_path):
    proc = (
        cli(*args, "--out", str(tmp_path / "x"), check=False)
        if args[0] == "run"
        else cli(*args, check=False)
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_refuses_to_overwrite_a_run(compact_run):
    out, _ = compact_run
    proc = cli("run", "--out", str(out), *SMALL_RUN, check=False)
    assert proc.returncode == 2 and "already holds a run" in proc.stderr


def test_bad_cost_table_is_rejected(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text(
        '{"bias_seconds": 0.001, "bs_probes": [4, 1], "alpha_seconds": [0, 0], '
        '"m_probes": [1], "theta_seconds": [0.1]}'
    )
    proc = cli("run", "--cost-table", str(bad), "--out", str(tmp_path / "r"), check=False)
    assert proc.returncode == 2 and "strictly increasing" in proc.stderr


def test_hash_password_makes_a_bcrypt_hash_that_verifies():
    import subprocess
    import sys

    import bcrypt

    proc = subprocess.run(
        [sys.executable, "-m", "dspark_obs", "hash-password", "--rounds", "4"],
        input="s3cret\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    hashed = proc.stdout.strip()
    assert hashed.startswith("$2b$04$") and "s3cret" not in proc.stdout + proc.stderr
    assert bcrypt.checkpw(b"s3cret", hashed.encode())
    empty = subprocess.run(
        [sys.executable, "-m", "dspark_obs", "hash-password"],
        input="\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert empty.returncode == 2 and "empty password" in empty.stderr


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["summary", "--help"]])
def test_top_level_and_command_help_import_no_other_command(argv):
    """`--version` and `--help` load no data library and no subcommand: only the command a
    user names is imported (its start-up time is in the `cli_startup` benchmark)."""
    import subprocess
    import sys

    probe = (
        "import json, sys\n"
        "from dspark_obs.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('numpy', 'polars', 'matplotlib') or m.startswith('dspark_obs.cli.'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    commands = [m for m in loaded if m.endswith("_cmd")]
    if argv[0] == "summary":
        assert commands == ["dspark_obs.cli.summary_cmd"]
    else:
        assert commands == []
        assert not any(m.split(".")[0] in ("numpy", "polars", "matplotlib") for m in loaded)


@pytest.mark.parametrize("command", ["summary", "estimate"])
def test_tables_split_by_columns_instead_of_cutting_cells(compact_run, command):
    """Piped at 80 columns (COLUMNS is honoured), no cell or header is cut to `…` and no line
    is wider than the terminal; every figure of the JSON is printed whole."""
    out, _ = compact_run
    text = cli(command, str(out), env={"COLUMNS": "80"}).stdout
    assert "…" not in text
    table_lines = [line for line in text.splitlines() if line[:1] in "┏┃┡│├└"]
    assert table_lines and max(len(line) for line in table_lines) <= 80
    if command == "summary":
        summary = json.loads(cli("summary", str(out), "--json").stdout)
        for entry in [*summary["workloads"].values(), summary["overall"]]:
            assert f"{entry['request_steps']:,}" in text
            assert f"{entry['throughput_tokens_per_s']:,.0f}" in text


def test_the_progress_bar_counts_the_work_a_sweep_does(compact_run):
    """The bar's whole is the sweep's rows plus a fixed share per step, which the run's
    steps add up to exactly (so its time left is not skewed toward the small levels)."""
    from dspark_obs.cli.progress import STEP_ROWS, sweep_work
    from dspark_obs.runtime.config import RuntimeConfig

    out, _ = compact_run
    config = json.loads((out / "run.json").read_text())["config"]
    wanted = RuntimeConfig(
        concurrency=config["concurrency"], steps_per_level=config["steps_per_level"]
    )
    steps = pl.read_parquet(out / "steps" / "*.parquet")
    assert sweep_work(wanted) == int((steps["bs"] + STEP_ROWS).sum())


@pytest.mark.parametrize(
    "command, records",
    [
        ("summary", lambda j: [{"workload": k, **v} for k, v in j["workloads"].items()]),
        ("calibration", lambda j: [p for e in j["workloads"].values() for p in e["positions"]]),
        ("whatif", lambda j: j["cells"]),
        (
            "estimate",
            lambda j: [
                {"method": m, **f}
                for e in j["workloads"].values()
                for m, f in e.items()
                if isinstance(f, dict)
            ],
        ),
    ],
)
def test_csv_holds_the_json_records(compact_run, command, records):
    """`--csv` (read back by polars) has a row for every record `--json` holds, with its
    figures under the same keys (nested ones dotted), to the last bits of a sum (each
    output is computed afresh)."""
    import io

    out, _ = compact_run
    want = records(json.loads(cli(command, str(out), "--json").stdout))
    got = pl.read_csv(io.StringIO(cli(command, str(out), "--csv").stdout), infer_schema_length=None)
    rows = got.to_dicts()
    if command in ("summary", "calibration"):
        rows = [r for r in rows if r["workload"] != "overall"]
    assert len(rows) == len(want)
    for row, record in zip(rows, want, strict=True):
        for key, value in record.items():
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, int | float) and np.isfinite(value):
                assert row[key] == pytest.approx(value, rel=1e-12), (key, row[key], value)
            elif isinstance(value, dict):
                for k, v in value.items():
                    if isinstance(v, int | float) and not isinstance(v, bool):
                        assert row[f"{key}.{k}"] == pytest.approx(v, rel=1e-12, nan_ok=True)
            elif isinstance(value, str):
                assert row[key] == value
    both = cli(command, str(out), "--csv", "--json", check=False)
    assert both.returncode == 2 and "not allowed with" in both.stderr
