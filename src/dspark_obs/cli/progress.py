"""A progress bar on stderr for commands that run longer than a few seconds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..telemetry import StepBatch


@contextmanager
def step_progress(
    total: int, label: str, enabled: bool = True
) -> Iterator[Callable[[StepBatch], None]]:
    """Yield `advance(batch)`; shows steps done, batch size and committed tokens."""
    if not enabled:
        yield lambda batch: None
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps  bs {task.fields[bs]:>3}  {task.fields[tokens]:,} tokens"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    tokens = 0
    with progress:
        task = progress.add_task(label, total=total, bs=0, tokens=0)

        def advance(batch: StepBatch) -> None:
            nonlocal tokens
            tokens += int(batch.acc_len.sum())
            progress.update(task, advance=1, bs=batch.bs, tokens=tokens)

        yield advance
