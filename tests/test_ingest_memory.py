"""`ingest`'s memory follows its input, not the number of ranks and workloads in it.

A 256-rank file of a few steps a rank has hundreds of (rank, workload) label groups;
when `ingest` folded request rows into the live aggregates (about 1 MB of histograms a
group, which nothing of a run directory reads) it allocated 786 MB for a 2 MB file; it
now allocates about 60 MB, most of it the estimator's state of those groups.
The bound here is on what Python and numpy allocate (tracemalloc), so it holds however
fast or loaded the machine is; `python -m bench ingest_memory` measures resident size.
"""

from __future__ import annotations

import json
import tracemalloc

import polars as pl

from bench.ingest_memory import SAMPLE, many_ranks
from dspark_obs.ingest import ingest_files
from dspark_obs.sources.workloads import workload_rule

RANKS = 256
PER_RANK = 4
#: What ingest may allocate: a few times its text (the text, one chunk's StepBatches, the
#: run store's buffer) over a fixed allowance for the estimator's state of the most label
#: groups the series budget allows (about 50 KB a group, 256 named and each rank's other).
TIMES_INPUT = 8
FIXED_MB = 96


def _first_records() -> list[dict]:
    info = json.loads(SAMPLE.read_text())["internal_states"][0]["dspark_info_record"]
    return info["records"][:PER_RANK]


def test_a_many_rank_file_takes_memory_of_its_size(tmp_path):
    source = tmp_path / "answer.json"
    steps = many_ranks(source, RANKS, PER_RANK)
    size_mb = source.stat().st_size / 2**20
    tracemalloc.start()
    try:
        _, stats = ingest_files([source], tmp_path / "run", workload_rule(None, None))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the work was done: every step and request row is in the run
    assert stats["ingested_steps"] == steps
    assert len(stats["ranks"]) == RANKS
    rows = pl.read_parquet(tmp_path / "run" / "requests" / "*.parquet")
    assert rows.height == RANKS * sum(len(r.get("reqs") or []) for r in _first_records())
    assert rows["rank"].n_unique() == RANKS
    limit_mb = TIMES_INPUT * size_mb + FIXED_MB
    assert peak / 2**20 < limit_mb, (
        f"ingest of a {size_mb:.1f} MB file of {RANKS} ranks allocated {peak / 2**20:.0f} MB "
        f"at its peak (bound {limit_mb:.0f} MB)"
    )
