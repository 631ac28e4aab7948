"""What every published path says about one fixed stored run, and how to compare two sayings.

The run under `data/golden/run` was recorded once by `dspark-obs run` (seed 11, concurrency
4 and 96, 40 steps a level, cap-accept shadow). Its outputs through the CLI (`summary --json`,
`estimate --json`, `whatif --json`, `report`'s report.json) and through a live `serve` replay
(`/metrics`) are kept under `data/golden/expected`; a change that means to leave behaviour
alone must leave them alone. After a change that means to alter an output, regenerate them
with `python -m tests.golden_outputs --write` and say why in the commit.

Comparison is exact for text, integers and every byte of `/metrics` outside sample values;
float values compare to 1e-9 relative, because numpy's exp and log (SIMD variants) and polars'
parallel sums may differ in the last bits on another machine.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "golden"
RUN = GOLDEN / "run"
EXPECTED = GOLDEN / "expected"
NAMES = ("summary.json", "estimate.json", "whatif.json", "report.json", "metrics.txt")
REL_TOL = 1e-9

_SERVING = re.compile(r"^serving (?P<url>https?://\S+/metrics)", re.MULTILINE)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _cli(*args: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_obs", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "160"},
    )
    if proc.returncode != 0:
        raise AssertionError(f"dspark-obs {' '.join(args)}: rc {proc.returncode}\n{proc.stderr}")
    return proc.stdout


def _served_metrics(cwd: Path, deadline_s: float = 300.0) -> str:
    """`/metrics` of `serve` replaying the run as fast as it can, scraped once it has ended."""
    out, err = cwd / "serve.out", cwd / "serve.err"
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dspark_obs",
                "serve",
                "--source",
                "run:run",
                "--speed",
                "0",
                "--listen",
                "127.0.0.1:0",
            ],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=fo,
            stderr=fe,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        end = time.monotonic() + deadline_s
        while "ended after" not in out.read_text():
            if proc.poll() is not None or time.monotonic() > end:
                log = out.read_text() + err.read_text()
                raise AssertionError(f"serve replay did not end:\n{log}")
            time.sleep(0.05)
        url = _SERVING.search(out.read_text()).group("url")
        with _OPENER.open(url, timeout=30) as resp:
            return resp.read().decode()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def capture(workdir: Path) -> dict[str, str]:
    """Every output of the golden run, produced in `workdir` (the run is copied there)."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(RUN, workdir / "run")
    _cli("report", "run", "--out", "report", "--quiet", cwd=workdir)
    return {
        "summary.json": _cli("summary", "run", "--json", cwd=workdir),
        "estimate.json": _cli("estimate", "run", "--json", cwd=workdir),
        "whatif.json": _cli("whatif", "run", "--json", cwd=workdir),
        "report.json": (workdir / "report" / "report.json").read_text(),
        "metrics.txt": _served_metrics(workdir),
    }


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)


def json_differences(a, b, path: str = "$") -> list[str]:
    """Where two decoded JSON values differ, beyond float noise."""
    if (
        isinstance(a, bool)
        or isinstance(b, bool)
        or not (isinstance(a, (int, float)) and isinstance(b, (int, float)))
    ):
        if type(a) is not type(b):
            return [f"{path}: {a!r} != {b!r}"]
        if isinstance(a, dict):
            if list(a) != list(b):
                return [f"{path}: keys {list(a)} != {list(b)}"]
            return [d for k in a for d in json_differences(a[k], b[k], f"{path}.{k}")]
        if isinstance(a, list):
            if len(a) != len(b):
                return [f"{path}: {len(a)} items != {len(b)}"]
            pairs = enumerate(zip(a, b, strict=True))
            return [d for i, (x, y) in pairs for d in json_differences(x, y, f"{path}[{i}]")]
        return [] if a == b else [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, int) and isinstance(b, int):
        return [] if a == b else [f"{path}: {a} != {b}"]
    return [] if _close(float(a), float(b)) else [f"{path}: {a!r} != {b!r}"]


def exposition_differences(a: str, b: str) -> list[str]:
    """Where two exposition texts differ: every line equal, sample values up to float noise."""
    la, lb = a.splitlines(), b.splitlines()
    if len(la) != len(lb):
        return [f"{len(la)} lines != {len(lb)}"]
    out = []
    for i, (x, y) in enumerate(zip(la, lb, strict=True)):
        if x == y:
            continue
        if x.startswith("#") or y.startswith("#"):
            out.append(f"line {i + 1}: {x!r} != {y!r}")
            continue
        (sx, vx), (sy, vy) = x.rsplit(" ", 1), y.rsplit(" ", 1)
        integral = vx.lstrip("-").isdigit(), vy.lstrip("-").isdigit()
        if sx != sy or integral[0] != integral[1] or not _close(float(vx), float(vy)):
            out.append(f"line {i + 1}: {x!r} != {y!r}")
    return out


def differences(name: str, got: str, want: str) -> list[str]:
    if name.endswith(".json"):
        return json_differences(json.loads(got), json.loads(want))
    return exposition_differences(got, want)


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.golden_outputs --write")
    with tempfile.TemporaryDirectory() as tmp:
        EXPECTED.mkdir(parents=True, exist_ok=True)
        for name, text in capture(Path(tmp)).items():
            (EXPECTED / name).write_text(text)
            print(EXPECTED / name)
