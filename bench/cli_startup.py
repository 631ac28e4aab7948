"""P7: how long `dspark-obs` takes to answer `--version`, `--help` and a command's `--help`.

Each call is a fresh process, as a user or a script starts it. The baseline is the
same interpreter doing nothing (`python -c pass`), measured alternately in the same
run: what is left is what dspark-obs itself costs before any work starts.
"""

from __future__ import annotations

import subprocess
import sys

from .common import record, repeat_pair, with_baseline

TARGET_S = 0.3
CALLS = (("version", ["--version"]), ("help", ["--help"]), ("command_help", ["run", "--help"]))


def _call(args: list[str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "dspark_obs", *args], check=True, stdout=subprocess.DEVNULL
    )


def _nothing() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def run(quick: bool) -> list[dict]:
    n = 2 if quick else 20
    out = []
    for name, args in CALLS:
        times, base = repeat_pair(lambda a=args: _call(a), _nothing, n, n)
        rec = record(
            f"P7_cli_{name}",
            {"argv": args},
            "s_per_call",
            times,
            1.0,
            target=TARGET_S if name != "command_help" else None,
        )
        out.append(with_baseline(rec, base, 1.0, baseline="python -c pass, the bare interpreter"))
    return out
