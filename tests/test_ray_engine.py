"""The fleet commands on a real Ray cluster (a head and two worker nodes, each its own
raylet and worker processes on loopback) give what they give in process.

One shared test runs every job through both engines and holds each against the
in-process fleet functions (`summarize_fleet`, `fleet_calibration_report`,
`fleet_evaluate`, `whatif`): the engines must agree to 1e-12, as must each command's
`--json` with `--engine ray` and without. A worker SIGKILLed in the middle of a task is
retried and changes nothing; an unreadable run is named and counted (an error with
--strict); a partition of a node some Ray node declares runs on that node; a run behind a
`file://` URI reads as the same run on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from dspark_obs.estimator.fleet import fleet_evaluate

from dspark_obs.analysis.reliability import fleet_calibration_report
from dspark_obs.analysis.summary import summarize_fleet
from dspark_obs.engine import InProcessEngine, Unread, partitions_of
from dspark_obs.engine.jobs import calibration_job, estimate_job, summary_job, whatif_job
from dspark_obs.store import open_run
from dspark_obs.store.fleet import open_fleet
from dspark_obs.strict_json import clean_json
from dspark_obs.whatif.predict import whatif

from .conftest import cli
from .fleet_reference import assert_same

ray = pytest.importorskip("ray", reason="the Ray engine needs dspark-obs[ray]")
from ray.cluster_utils import Cluster  # noqa: E402

from dspark_obs.engine.ray_engine import RayEngine  # noqa: E402

#: A cluster for the module and its longest tests: the file starts first (tests/conftest.py).
pytestmark = pytest.mark.slow

#: The fleet nodes of the runs; each worker node declares one as its resource.
NODES = ("node-a", "west-7", "east-3")
BY = ("node", "rank")


@pytest.fixture(scope="module")
def ray_fleet(fleet, tmp_path_factory) -> Path:
    """Three runs of three nodes: the fleet fixture's two and a copy naming `east-3`."""
    root = tmp_path_factory.mktemp("ray_fleet") / "fleet"
    root.mkdir()
    for run in fleet[1]:
        shutil.copytree(run, root / run.name)
    shutil.copytree(fleet[1][0], root / "third")
    manifest = json.loads((root / "third" / "run.json").read_text())
    (root / "third" / "run.json").write_text(json.dumps({**manifest, "instance": "east-3"}))
    return root


@pytest.fixture(scope="module")
def cluster():
    """A head with no CPU (tasks go to the workers) and two one-CPU worker nodes."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        c.add_node(num_cpus=1, resources={"dspark_node:node-a": 1})
        c.add_node(num_cpus=1, resources={"dspark_node:west-7": 1})
        c.wait_for_nodes()
        ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def engines(cluster):
    return {"local": InProcessEngine(), "ray": RayEngine(cluster.address)}


def _expected(ray_fleet: Path) -> dict:
    fleet = open_fleet([ray_fleet], BY)
    return {
        "summary": summarize_fleet(fleet, BY),
        "calibration": fleet_calibration_report(fleet, 10, BY),
        "estimate": clean_json(fleet_evaluate(fleet, BY)),
    }


@pytest.mark.parametrize("name", ["local", "ray"])
def test_every_job_equals_the_in_process_fleet_on_both_engines(engines, ray_fleet, name):
    engine = engines[name]
    want = _expected(ray_fleet)
    got = {
        "summary": summary_job(engine, [ray_fleet], BY)[0],
        "calibration": calibration_job(engine, [ray_fleet], 10, BY)[0],
        "estimate": clean_json(estimate_job(engine, [ray_fleet], BY)[0]),
    }
    for command in want:
        assert_same(got[command], want[command], command)
    assert want["summary"]["overall"]["request_steps"] > 0
    assert [r["node"] for r in want["summary"]["runs"]] == ["node-a", "west-7", "east-3"]
    run = ray_fleet / "other"
    predicted, _ = whatif_job(engine, run, ["static", "window=2"])
    assert_same(clean_json(predicted), clean_json(whatif(open_run(run), ["static", "window=2"])))


def test_partitions_run_on_the_node_that_declares_them(engines, ray_fleet):
    by_resource = {
        key.split(":", 1)[1]: n["NodeID"]
        for n in ray.nodes()
        if n["Alive"]
        for key in n["Resources"]
        if key.startswith("dspark_node:")
    }
    assert set(by_resource) == {"node-a", "west-7"}
    assert len(set(by_resource.values())) == 2
    for _ in range(3):  # a placement that lands right by chance once does not pass
        _, read = summary_job(engines["ray"], [ray_fleet])
        placed = dict(zip(read.head.nodes, read.read_on, strict=True))
        assert placed["node-a"] == by_resource["node-a"]
        assert placed["west-7"] == by_resource["west-7"]
        assert placed["east-3"] in set(by_resource.values())  # declared by none: anywhere


def test_a_file_uri_reads_as_the_runs_on_disk(engines, ray_fleet):
    uri = "file://" + str(ray_fleet)
    assert [p.path for p in partitions_of([uri])] == [
        "file://" + str(ray_fleet / n) for n in ("node-a", "other", "third")
    ]
    got, _ = summary_job(engines["ray"], [uri], BY)
    want = _expected(ray_fleet)["summary"]
    assert [r["node"] for r in got["runs"]] == [r["node"] for r in want["runs"]]
    for key in ("overall", "workloads", "load", "groups"):
        assert_same(got[key], want[key], key)


def _task_pids(name: str) -> list[int]:
    """Worker processes executing a task of `name` now (Ray titles them `ray::NAME`)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(f"ray::{name}".encode()):
                pids.append(int(entry.name))
    return pids


def test_a_worker_killed_mid_task_changes_nothing(engines, ray_fleet, tmp_path):
    many = tmp_path / "many"
    many.mkdir()
    for i in range(8):
        shutil.copytree(ray_fleet / "other", many / f"run-{i}")
    want = summary_job(engines["local"], [many], BY)[0]
    out: dict = {}
    job = threading.Thread(target=lambda: out.update(got=summary_job(engines["ray"], [many], BY)))
    job.start()
    killed = []
    while job.is_alive() and len(killed) < 2:
        for pid in _task_pids("_read_here"):
            if pid not in killed:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
        time.sleep(0.005)
    job.join(timeout=240)
    assert killed, "no task was caught running: the kill test proved nothing"
    got, read = out["got"]
    assert not read.unread
    assert_same(got, want)


def _damage(run: Path) -> Path:
    part = next(p for p in sorted((run / "requests").rglob("*.parquet")))
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    return part


def test_an_unreadable_run_is_named_and_counted(engines, ray_fleet, tmp_path):
    fleet = tmp_path / "fleet"
    shutil.copytree(ray_fleet, fleet)
    _damage(fleet / "third")
    whole = summary_job(engines["local"], [fleet / "node-a", fleet / "other"], BY)[0]
    for name in ("local", "ray"):
        got, read = summary_job(engines[name], [fleet], BY)
        assert read.unread == [Unread(str(fleet / "third"), read.unread[0].error)]
        assert "third" in read.unread[0].error
        assert got["unread"] == [{"path": str(fleet / "third"), "error": read.unread[0].error}]
        assert_same({k: v for k, v in got.items() if k != "unread"}, whole)


def _ray_cli(*args: str, check: bool = True):
    return cli(*args, "--engine", "ray", "--ray-address", ray.get_runtime_context().gcs_address,
               check=check)  # fmt: skip


def test_every_command_json_on_ray_equals_in_process(cluster, ray_fleet, tmp_path):
    for args in (
        ("summary", str(ray_fleet), "--by", "node,rank", "--json"),
        ("calibration", str(ray_fleet), "--by", "node", "--bins", "10", "--json"),
        ("estimate", str(ray_fleet), "--by", "node", "--json"),
        ("whatif", str(ray_fleet / "other"), "--policy", "static", "--json"),
    ):
        want = json.loads(cli(*args).stdout)
        assert_same(json.loads(_ray_cli(*args).stdout), want, args[0])


def test_an_unreadable_run_on_the_cli_is_named_or_with_strict_an_error(
    cluster, ray_fleet, tmp_path
):
    fleet = tmp_path / "fleet"
    shutil.copytree(ray_fleet, fleet)
    _damage(fleet / "other")
    proc = _ray_cli("summary", str(fleet), "--json")
    assert proc.returncode == 0
    assert [u["path"] for u in json.loads(proc.stdout)["unread"]] == [str(fleet / "other")]
    assert "1 of 3 runs unreadable" in proc.stderr and str(fleet / "other") in proc.stderr
    strict = _ray_cli("summary", str(fleet), "--json", "--strict", check=False)
    assert strict.returncode == 2 and strict.stdout == ""
    assert str(fleet / "other") in strict.stderr and "--strict" in strict.stderr


def test_without_ray_the_flag_is_a_one_line_error(ray_fleet):
    code = (
        "import sys; sys.modules['ray'] = None; from dspark_obs.cli.main import main; "
        f"sys.exit(main(['summary', {str(ray_fleet)!r}, '--engine', 'ray']))"
    )
    import subprocess

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "dspark-obs[ray]" in proc.stderr


# --- report: the fleet arm's light views as a map over runs and a reduce ---------------


def _report(engine, paths, out: Path, **options):
    from dspark_obs.report import build_report

    report = build_report(paths, out, top=5, by=BY, engine=engine, **options)
    return json.loads(report.json.read_text()), report.markdown.read_text()


def _same_tables(got: str, want: str) -> None:
    """summary.md's tables equal cell by cell, numbers to 1e-12, the text around them too."""
    from .test_report import parse_tables

    def cell(text: str):
        try:
            return float(text.split(" [")[0].replace(",", ""))
        except ValueError:
            return text

    g, w = parse_tables(got), parse_tables(want)
    assert list(g) == list(w) and len(w) > 5
    for title in w:
        assert_same(
            [{k: cell(v) for k, v in r.items()} for r in g[title]],
            [{k: cell(v) for k, v in r.items()} for r in w[title]],
            title,
        )
    prose = [line for line in want.splitlines() if not line.startswith("|")]
    assert [line for line in got.splitlines() if not line.startswith("|")] == prose


@pytest.fixture(scope="module")
def reports(engines, ray_fleet, tmp_path_factory) -> dict:
    """The fleet's report in process (None) and on each engine, each built once for the
    tests that read it."""
    out = tmp_path_factory.mktemp("reports")
    return {
        name: _report(engines.get(name), [ray_fleet], out / str(name))
        for name in (None, "local", "ray")
    }


def test_the_report_on_ray_equals_the_in_process_one(reports):
    want_json, want_md = reports[None]
    for name in ("local", "ray"):
        got_json, got_md = reports[name]
        assert_same(got_json, want_json, name)
        _same_tables(got_md, want_md)
    fleet = want_json["fleet"]
    assert [r["node"] for r in fleet["runs"]] == list(NODES)
    for view in ("summary", "window_shares", "load", "cost", "estimate", "top_requests"):
        assert fleet[view], view
    assert fleet["calibration"]["survival"]["overall"]


def _timed_union(ray_fleet: Path):
    import polars as pl

    from dspark_obs.analysis.cost_fit import timed_steps

    runs = [open_run(ray_fleet / n) for n in ("node-a", "other", "third")]
    return runs, pl.concat([r.steps() for r in runs], how="diagonal_relaxed"), timed_steps


def test_the_fleet_cost_fit_is_the_concatenated_steps_own(reports, ray_fleet):
    """Up to the sample's bound every timed step is kept, in the runs' order: the fit is
    `fit_cost_steps` of the runs' steps concatenated (the in-process definition before)."""
    from dspark_obs.analysis.cost_fit import fit_cost_steps

    runs, steps, _ = _timed_union(ray_fleet)
    want = fit_cost_steps(steps, {"cost_table": runs[0].manifest.get("cost_table")})
    got, _ = reports["ray"]
    cost = got["fleet"]["cost"]
    assert cost["cells"] == want.cells and want.steps > 100
    assert_same(cost["fitted"], clean_json(vars(want.fitted)))
    assert_same(cost["table"], json.loads(want.table.to_json()))


def test_past_its_bound_the_cost_sample_is_the_fleet_s_smallest_priorities(ray_fleet, monkeypatch):
    """Folded run by run, the sample is the `bound` smallest priorities of all the runs'
    timed steps together, in the runs' order; the table is the full cells' all the same."""
    import numpy as np
    import polars as pl

    from dspark_obs.analysis.cost_fit import cell_sums, fit_cost_cells
    from dspark_obs.report import fleet_map

    runs, steps, timed_steps = _timed_union(ray_fleet)
    nodes = ("node-a", "west-7", "east-3")
    own = [timed_steps(r.steps()).collect() for r in runs]
    every = pl.concat(
        [
            t.with_columns(_p=fleet_map._priorities(fleet_map._seed(n, r.manifest), t.height))
            for t, r, n in zip(own, runs, nodes, strict=True)
        ],
        how="diagonal_relaxed",
    )
    bound = every.height // 5
    threshold = np.sort(every["_p"].to_numpy())[bound - 1]
    want_sample = every.filter(pl.col("_p") <= threshold).drop("_p")
    monkeypatch.setattr(fleet_map, "COST_SAMPLE", bound)
    fold = fleet_map.LightFold()
    parts = [
        fold.keep(i, fleet_map.run_part(r, n, (), 5))
        for i, (r, n) in enumerate(zip(runs, nodes, strict=True))
    ]
    assert fold.sample is not None and fold.sample.height == bound
    got_sample = fold.sample.sort("_run", "_row").drop("_run", "_row", "_priority")
    assert got_sample.equals(want_sample)
    fit, missing = fold.cost(parts, {"cost_table": runs[0].manifest.get("cost_table")})
    assert missing is None
    want = fit_cost_cells(cell_sums(timed_steps(steps)), want_sample.lazy(), runs[0].manifest)
    assert fit.steps == every.height and fit.fitted.steps == bound
    assert_same(clean_json(vars(fit.fitted)), clean_json(vars(want.fitted)))
    assert_same(json.loads(fit.table.to_json()), json.loads(want.table.to_json()))


def test_report_cli_on_ray_equals_in_process_and_names_an_unreadable_run(
    cluster, ray_fleet, reports, tmp_path
):
    """`report --engine ray` writes the in-process report of the same options (the module's,
    built once), and names a run it cannot read."""
    args = ("report", str(ray_fleet), "--by", ",".join(BY), "--top", "5", "--quiet")
    _ray_cli(*args, "--out", str(tmp_path / "ray"))
    want_json, want_md = reports[None]
    assert_same(json.loads((tmp_path / "ray" / "report.json").read_text()), want_json)
    _same_tables((tmp_path / "ray" / "summary.md").read_text(), want_md)
    fleet = tmp_path / "fleet"
    shutil.copytree(ray_fleet, fleet)
    _damage(fleet / "other")
    proc = _ray_cli("report", str(fleet), "--quiet", "--out", str(tmp_path / "gap"))
    got = json.loads((tmp_path / "gap" / "report.json").read_text())["fleet"]
    assert [u["path"] for u in got["unread"]] == [str(fleet / "other")]
    assert [r["node"] for r in got["runs"]] == ["node-a", "east-3"]
    assert "1 of 3 runs unreadable" in proc.stderr
    strict = _ray_cli(
        "report", str(fleet), "--quiet", "--strict", "--out", str(tmp_path / "s"), check=False
    )
    assert strict.returncode == 2 and str(fleet / "other") in strict.stderr
    assert not (tmp_path / "s" / "report.json").exists()
    local = cli("report", str(fleet), "--quiet", "--out", str(tmp_path / "l2"), check=False)
    assert local.returncode == 2 and str(fleet / "other") in local.stderr


def test_one_run_on_ray_is_a_fleet_of_one_predicted_where_it_lives(engines, ray_fleet, tmp_path):
    from dspark_obs.report import build_report

    run = ray_fleet / "other"
    want = build_report([run], tmp_path / "local", top=5, engine=engines["local"])
    got = build_report([run], tmp_path / "ray", top=5, engine=engines["ray"])
    w, g = (json.loads(r.json.read_text())["fleet"] for r in (want, got))
    assert w["whatif"] and w["whatif_missing"] is None
    assert_same(g, w)


# --- runs on paths only the worker nodes hold --------------------------------------------


def test_a_path_the_driver_cannot_see_is_listed_and_read_on_the_nodes(
    engines, ray_fleet, monkeypatch
):
    """On one machine every node sees every path, so the driver is made blind to the
    fleet's directory (it cannot see it and must not list it): the runs are then those the
    worker nodes' discovery tasks list, each read on a node that found it, the run of a
    declared fleet node on the node declaring it; the figures are the in-process ones."""
    from dspark_obs.engine import partitions

    blind = str(ray_fleet)
    seen = partitions.visible_here
    monkeypatch.setattr(partitions, "visible_here", lambda p: str(p) != blind and seen(p))

    def no_listing(paths):
        raise AssertionError(f"the driver listed {paths}")

    monkeypatch.setattr(partitions, "expand_run_dirs", no_listing)
    with pytest.raises(AssertionError, match="the driver listed"):
        summary_job(engines["local"], [ray_fleet], BY)
    got, read = summary_job(engines["ray"], [ray_fleet], BY)
    monkeypatch.undo()
    assert_same(got, _expected(ray_fleet)["summary"])
    workers = {
        key.split(":", 1)[1]: n["NodeID"]
        for n in ray.nodes()
        if n["Alive"]
        for key in n["Resources"]
        if key.startswith("dspark_node:")
    }
    found = {p.node: p.found_on for p in read.partitions}
    assert set(found) == set(NODES) and None not in found.values()
    assert found["node-a"] == workers["node-a"] and found["west-7"] == workers["west-7"]
    assert found["east-3"] in workers.values()
    assert dict(zip(read.head.nodes, read.read_on, strict=True)) == found
