"""A progress bar on stderr for commands that run longer than a few seconds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from ..runtime.config import RuntimeConfig
from ..telemetry import StepBatch

#: A step's cost beyond its rows, in rows: a sweep's step at batch size 1 takes about as
#: long as 64 extra rows of one at 256 (drafting, scheduling and storing a step have a
#: fixed part), so the bar moves by `bs + STEP_ROWS` a step and its time left holds
#: across the sweep's levels; counted in steps, the small early levels made it about half.
STEP_ROWS = 64


def sweep_work(config: RuntimeConfig) -> int:
    """The bar's whole: every step of the sweep at its level's batch size, in rows."""
    return sum(
        n * (bs + STEP_ROWS) for n, bs in zip(config.steps_at(), config.concurrency, strict=True)
    )


@contextmanager
def step_progress(
    config: RuntimeConfig, label: str, enabled: bool = True
) -> Iterator[Callable[[StepBatch], None]]:
    """Yield `advance(batch)`; shows steps done, batch size and committed tokens."""
    if not enabled:
        yield lambda batch: None
        return
    steps = config.total_steps
    work = sweep_work(config)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[steps]:,}/{task.fields[of]:,} steps"),
        TextColumn("bs {task.fields[bs]:>3}  {task.fields[tokens]:,} tokens"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    tokens = done = 0
    with progress:
        task = progress.add_task(label, total=work, bs=0, tokens=0, steps=0, of=steps)

        def advance(batch: StepBatch) -> None:
            nonlocal tokens, done
            tokens += int(batch.acc_len.sum())
            done += 1
            progress.update(
                task, advance=batch.bs + STEP_ROWS, bs=batch.bs, tokens=tokens, steps=done
            )

        yield advance
