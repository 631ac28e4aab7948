"""Shared fixtures: small stored runs made once per test command by the real CLI.

Under pytest-xdist each worker is a session of its own, so a session fixture alone would
make every run once per worker; the runs below are made once, by the first worker to ask,
in the directory the workers share, and read by the others. No test writes into them
(those that change a run copy it first).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

SMALL_RUN = [
    "--concurrency",
    "4,32",
    "--steps-per-level",
    "60",
    "--sts-warmup-steps",
    "60",
    "--max-new-tokens",
    "200",
    "--quiet",
]


def cli(*args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `dspark-obs` as a user would: a separate process, real argv, real exit status
    (piped, 160 columns unless `env` says otherwise)."""
    env = {**os.environ, "COLUMNS": "160", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_obs", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dspark-obs {' '.join(args)} -> {proc.returncode}\n{proc.stderr}")
    return proc


def made_once(tmp_path_factory, name: str, make) -> Path:
    """`make(directory)` run once for all the workers of this test command: `directory`
    (under the base temporary directory they share), made by whichever worker asks first
    while the others wait on its lock. A file beside it says the making finished."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # .../pytest-N/popen-gwK: the workers share pytest-N
    where = shared / "made-once" / name
    where.parent.mkdir(exist_ok=True)
    done = where.with_suffix(".done")
    with FileLock(str(where.with_suffix(".lock"))):
        if not done.exists():
            shutil.rmtree(where, ignore_errors=True)  # a making that failed before
            where.mkdir()
            make(where)
            done.touch()
    return where


@pytest.fixture(scope="session")
def compact_run(tmp_path_factory) -> tuple[Path, dict]:
    def make(root: Path) -> None:
        proc = cli(
            "run",
            *("--mode", "compact", "--shadow", "cap-accept"),
            *("--out", str(root / "compact"), "--json"),
            *SMALL_RUN,
        )
        (root / "summary.json").write_text(proc.stdout)

    root = made_once(tmp_path_factory, "compact", make)
    return root / "compact", json.loads((root / "summary.json").read_text())


@pytest.fixture(scope="session")
def fleet(compact_run, tmp_path_factory) -> tuple[Path, list[Path]]:
    """A directory of two runs: the session's compact run and one of other traffic whose
    manifest names its instance (so its node is that name, not its directory's)."""

    def make(root: Path) -> None:
        shutil.copytree(compact_run[0], root / "node-a")
        other = root / "other"
        cli(
            "run",
            *("--mode", "compact", "--shadow", "cap-accept", "--seed", "5", "--sts", "none"),
            *("--concurrency", "16", "--steps-per-level", "50", "--mix", "1,3,1"),
            *("--out", str(other), "--quiet"),
        )
        manifest = json.loads((other / "run.json").read_text())
        manifest["instance"] = "west-7"
        (other / "run.json").write_text(json.dumps(manifest))

    root = made_once(tmp_path_factory, "fleet", make)
    return root, [root / "node-a", root / "other"]


@pytest.fixture(scope="session")
def mismatched_runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny runs no compact fleet merges with: one of gamma 5, one static."""

    def make(root: Path) -> None:
        small = ("--concurrency", "4", "--steps-per-level", "10", "--sts", "none", "--quiet")
        cli("run", "--gamma", "5", "--out", str(root / "g5"), *small)
        cli("run", "--mode", "static", "--out", str(root / "static"), *small)

    root = made_once(tmp_path_factory, "mismatched", make)
    return root / "g5", root / "static"


def pytest_collection_modifyitems(config, items):
    """Files holding a `slow` test first. tools/test.sh runs `-n 3 --dist loadfile
    --no-loadscope-reorder`, which hands files to the workers in this order: a long file
    started last would run alone while the other workers sat idle, so the long ones start
    first and the many short files fill in beside them."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
