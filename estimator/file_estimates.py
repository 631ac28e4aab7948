"""Ceiling estimates straight from SGLang's block-accept JSONL, without a run directory.

For an operator who has only the file SGLang wrote: the sampled walk per workload, with
its interval, in one pass (`ingest` stores the same walk as a run instead).
"""

from __future__ import annotations

from pathlib import Path

from dspark_obs.telemetry.batch import MAX_GAMMA
from dspark_obs.telemetry.block_accept_log import read_block_accept_jsonl

from .block_accept_walk import model_report, summarize_by_workload, tail_model, walk_blocks


def block_accept_estimates(path: Path, gamma: int | None = None) -> dict:
    """Per workload, the sampled walk's means and interval over the file's blocks, and
    what its tail model (the extrapolation of unreached positions) rests on.

    `gamma` is implied by the file's blocks when not given, as `ingest` does; lines
    that contradict it are bad lines. A file with no usable line (empty, not JSONL,
    a `/server_info` dump) is a ValueError saying so, not an empty result.
    """
    if gamma is not None and not 1 <= gamma <= MAX_GAMMA:
        raise ValueError(f"--gamma {gamma} outside 1..{MAX_GAMMA}")
    log = read_block_accept_jsonl(path, gamma)
    if not log.n_rows:
        first = log.bad_line_samples[0] if log.bad_line_samples else None
        why = f"; line {first[0]}: {first[1]}" if first else ""
        raise ValueError(
            f"{path}: no block-accept rows in {log.n_lines} lines ({log.bad_lines} bad{why}); "
            "is it SGLang's SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH JSONL? "
            "(a /server_info dump goes to `dspark-obs ingest`)"
        )
    gamma = log.gamma
    if gamma is None:
        raise ValueError(f"{path}: no row opened a block, so gamma is not implied: pass --gamma")
    model = tail_model(log, gamma) if log.n_blocks else None
    blocks = walk_blocks(log, gamma, model)
    models = model_report(model) if model is not None else {}
    return {
        "source": str(path),
        "gamma": gamma,
        "bad_lines": log.bad_lines,
        "bad_line_samples": [f"line {n}: {why}" for n, why in log.bad_line_samples],
        "workloads": {
            k: {"sampled": v, "tail_model": models.get(k)}
            for k, v in summarize_by_workload(blocks, log=log).items()
        },
    }
