"""`keep_freed_memory`: a step's freed temporaries are reused, not faulted in again.

Each case runs in a fresh interpreter (the setting is process-wide) and counts the
minor page faults of 200 steps that allocate and free arrays of the size a step's
columns have at B = 256 (256 KiB to 2 MiB).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from dspark_obs.allocator import keep_freed_memory

STEPS = r"""
import resource, sys
import numpy as np
from dspark_obs.allocator import keep_freed_memory

kept = keep_freed_memory() if sys.argv[1] == "keep" else False


def step(n):  # two temporaries alive at once, then both freed, as in a step
    a = np.ones(n)
    b = a * 2.0
    return float(b[-1])


faults = []
for n in (1 << 15, 1 << 17, 1 << 18):  # float64: 256 KiB, 1 MiB, 2 MiB
    step(n)  # the first step may fault; later ones are measured
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(200):
        step(n)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(kept, *faults)
"""


def faults(mode: str) -> tuple[bool, list[int]]:
    out = subprocess.run(
        [sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "True", [int(x) for x in out[1:]]


@pytest.mark.skipif(not keep_freed_memory(), reason="the C library is not glibc")
def test_freed_temporaries_are_reused_instead_of_faulted_in():
    kept, with_it = faults("keep")
    assert kept
    _, without = faults("default")
    # glibc's defaults: every step maps (or regrows) its temporaries afresh, two arrays
    # of n * 8 bytes in 4 KiB pages, 200 times
    assert all(f > 10_000 for f in without), without
    assert all(f < 100 for f in with_it), with_it


def test_every_cli_command_keeps_freed_memory(monkeypatch, tmp_path, capsys):
    from dspark_obs.cli import main as cli_main

    calls = []
    monkeypatch.setattr(cli_main, "keep_freed_memory", lambda: calls.append(1) or True)
    assert cli_main.main(["summary", str(tmp_path / "no-run")]) == 2
    assert calls == [1]
    assert "error" in capsys.readouterr().err
