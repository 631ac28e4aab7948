"""Ceiling estimates straight from SGLang's block-accept JSONL, without a run directory.

For an operator who has only the file SGLang wrote: the sampled walk per workload, with
its interval, in one pass (`ingest` stores the same walk as a run instead).
"""

from __future__ import annotations

from pathlib import Path

from dspark_obs.telemetry.block_accept_log import read_block_accept_jsonl

from .block_accept_walk import model_report, summarize_by_workload, tail_model, walk_blocks


def block_accept_estimates(path: Path, gamma: int | None) -> dict:
    """Per workload, the sampled walk's means and interval over the file's blocks, and
    what its tail model (the extrapolation of unreached positions) rests on."""
    if gamma is None:
        raise ValueError("--sglang-jsonl needs --gamma")
    log = read_block_accept_jsonl(path)
    model = tail_model(log, gamma) if log.n_blocks else None
    blocks = walk_blocks(log, gamma, model)
    models = model_report(model) if model is not None else {}
    return {
        "source": str(path),
        "gamma": gamma,
        "bad_lines": log.bad_lines,
        "workloads": {
            k: {"sampled": v, "tail_model": models.get(k)}
            for k, v in summarize_by_workload(blocks, log=log).items()
        },
    }
