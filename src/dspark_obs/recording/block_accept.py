"""A reference run's steps as SGLang's block-accept JSONL, beside its run directory.

The runtime knows what SGLang's recorder reads from a server (the target's
log-probabilities at committed positions, which requests finished and how), so a
run can leave the file SGLang would have written for the same trajectory; its
cap-accept shadow holds the truth for every block of it
(`estimator.block_accept_truth`).
"""

from __future__ import annotations

from ..runtime.engine import DSparkRuntime
from ..telemetry import StepBatch
from ..telemetry.block_accept_writer import BlockAcceptWriter


def write_block_accept_step(
    writer: BlockAcceptWriter, runtime: DSparkRuntime, batch: StepBatch
) -> None:
    """Call right after `runtime` took the step `batch`, before its next one."""
    writer.observe(batch, runtime.gather_target_logprobs)
    rows, natural = runtime.finished_in_last_step()
    writer.finished(batch.rid[rows].tolist(), natural.tolist())
