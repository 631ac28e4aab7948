"""Studies over many seeds: their runs in worker processes, their records as JSON Lines.

A study's unit of work (a world and a seed) is a whole run or several, minutes each, and
independent of the others; one worker process per core takes them in turn, and each
finished unit's records are appended to a file at once, so a study cut short keeps what
it finished and a longer one can be summarised while it runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

from ..outputs import open_append


def add_device_argument(ap: argparse.ArgumentParser) -> None:
    """A study's `--device`: its runs keep the cost table's step times (`RuntimeConfig.
    simulated_times`), since a study weighs acceptance, not a device's timings."""
    ap.add_argument(
        "--device",
        help="run the real world's networks there (e.g. cuda: a step costs about 15 ms on an "
        "H200 against 0.5 s on one CPU core); step times stay the cost table's",
    )


def _single_threaded() -> None:
    """Each worker owns one core: numpy's, torch's and polars' pools would fight over the rest."""
    for name in ("POLARS_MAX_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"


def in_workers(fn: Callable, calls: list[tuple], jobs: int, sink) -> list[dict]:
    """`fn(*call)` for every call, in `jobs` worker processes (in this one for 1), each
    one's records passed to `sink` (when given) as it finishes; all of them, in the order
    they finished."""
    records = []

    def take(part: list[dict]) -> None:
        records.extend(part)
        if sink is not None:
            sink(part)

    if jobs <= 1:
        for call in calls:
            take(fn(*call))
    else:
        # spawned, not forked: a fork of a process whose polars threads have started can
        # hang in the child
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=spawn, initializer=_single_threaded) as pool:
            for done in as_completed([pool.submit(fn, *call) for call in calls]):
                take(done.result())
    return records


@contextmanager
def jsonl_sink(path: str | None) -> Iterator[Callable[[list[dict]], None]]:
    """A sink appending each unit's records to `path` as one JSON line (nothing without one);
    OSError if the file cannot be opened (`OutputRefused` for a link or a non-file: appending
    is what a study's `--out` does, never through a link)."""
    out = open_append(path) if path else None
    try:

        def sink(part: list[dict]) -> None:
            if out is not None:
                out.write(json.dumps(part) + "\n")
                out.flush()

        yield sink
    finally:
        if out is not None:
            out.close()


def read_records(paths: list[str]) -> list[dict]:
    """Records from JSON Lines files as `jsonl_sink` writes them (one unit's list per line)."""
    records = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                records.extend(json.loads(line))
    return records
