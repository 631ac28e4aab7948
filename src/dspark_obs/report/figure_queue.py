"""Figure files named in page order and drawn off the analysis' critical path.

A report's figures are queued as the sections are built and drawn either inline or in one
worker process; the sections only say what to draw and under which section number, so
the file names sort in page order whichever way they were drawn. They are drawn into a
directory of their own inside `--out` and moved to their names only once every name the
command will write has been checked (`publish`): a planted link at any of them refuses
the command before it has changed anything in `--out`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path

from .. import names
from ..outputs import check_target
from ..plotting import save_png
from .document import Figure

#: Request-steps from which figures render in a worker process (see `FigureQueue`).
BACKGROUND_FIGURES_ROWS = 2_000_000
#: Most bytes of a run's label in a figure's file name (a name is at most 255 bytes).
LABEL_BYTES = 128


def _render(make: Callable, args: tuple, path: Path) -> None:
    save_png(make(*args), path)


class FigureQueue:
    """Names figure files and renders them, inline or in one worker process.

    Drawing is single-threaded Python while the polars passes leave a core idle
    between their parallel phases, so for a large run the figures of finished
    views render in a separate process (spawned: polars' thread pool does not
    survive a fork) while the next analysis runs. Small runs render inline,
    where starting a process would cost more than it saves. A worker that cannot
    start (a caller whose main module cannot be re-imported, such as stdin) or
    dies costs only speed: its unfinished figures are drawn inline.
    """

    def __init__(self, out: Path, background: bool) -> None:
        self.out = out
        self.staging = Path(tempfile.mkdtemp(prefix=".figures.", suffix=".tmp", dir=out))
        self.counts: dict[int, int] = {}
        self.pool = (
            ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
            if background
            else None
        )
        self.jobs: list[tuple[Callable, tuple, Path, Future | None]] = []

    def save(self, section: int, make: Callable, args: tuple, stem: str, caption: str) -> Figure:
        """Queue `make(*args)`; files are numbered by section, so they sort in page order."""
        k = self.counts[section] = self.counts.get(section, 0) + 1
        name = f"{section}.{k:02d}-{stem}.png"
        path = self.staging / name
        future = None
        if self.pool is not None:
            try:
                future = self.pool.submit(_render, make, args, path)
            except BrokenProcessPool:
                self.pool = None
        if future is None:
            _render(make, args, path)
        self.jobs.append((make, args, path, future))
        return Figure(self.out / name, caption)

    def close(self) -> None:
        """Wait for every queued figure; one the worker could not draw is drawn here."""
        for make, args, path, future in self.jobs:
            if future is None:
                continue
            try:
                future.result()
            except BrokenProcessPool:
                _render(make, args, path)
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def publish(self, others: Iterable[Path] = ()) -> None:
        """Move the drawn figures to their names, once none of them nor `others` (the
        command's other files) is a symbolic link or a directory; OutputRefused, with
        nothing in `--out` changed, otherwise."""
        drawn = [path for _, _, path, _ in self.jobs]
        try:
            for target in [*(self.out / p.name for p in drawn), *others]:
                check_target(target)
            for path in drawn:
                os.replace(path, self.out / path.name)
        finally:
            self.discard()

    def discard(self) -> None:
        """Remove the figures not published (a command that failed leaves none behind)."""
        shutil.rmtree(self.staging, ignore_errors=True)


def _slug(label: str) -> str:
    """`label` in a file name: letters, digits, `-` and `_`, at most LABEL_BYTES bytes (a
    longer label's slug ends in a hash of the label, so two labels keep two files)."""
    slug = "".join(c if c.isalnum() or c in "-_" else "-" for c in label)
    return names.fit_bytes(slug, LABEL_BYTES, original=label)


def arm_figures(
    w: FigureQueue, section: int, label: str, args: tuple, figures: list[tuple[Callable, str, str]]
) -> list[Figure]:
    """Queue `(make, stem, caption)` figures of one arm over the same arguments.

    The arm's label goes into every file stem and caption, so the views that
    repeat per arm neither overwrite each other's files nor read ambiguously.
    """
    return [
        w.save(section, make, args, f"{stem}-{_slug(label)}", f"{label}: {caption}")
        for make, stem, caption in figures
    ]
