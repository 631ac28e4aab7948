"""A production store's time range, read as runs: one run directory per (node, rank).

A post-hoc command given a store reads each stream (one node's rank) of the range as the
run it would have been, had that stream been recorded as one run: a *view*, a run
directory whose parts are hard links to the store's parts, in order and numbered again
(a published part never changes, so a link is the part), and whose hours the range cuts
hold only the steps stored inside it, with their request rows and estimates. Every
command then reads views as it reads runs, with the same answers, and a view is a
snapshot: retention deleting an hour later does not touch a view that links it. Views are
made beside the store's hours (`.views/`, so links need no copy), or in a temporary
directory where the store cannot be written, by copying.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ..durations import parse_duration
from .checksums import checksum_path
from .errors import RunStoreError
from .inventory import MANIFEST, REQUESTS, STEPS, list_parts, part_name
from .production import PARTITION_SECONDS, STORE_MARKER, hour_of, is_store, segment_of
from .reader import open_run
from .tables import STEP_KEY, STEP_TIME
from .writer import publish_part

VIEWS = ".views"
#: Formats `--between` takes, besides Unix seconds (UTC where no offset is given).
_TIME_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H", "%Y-%m-%d")


@dataclass(frozen=True)
class TimeRange:
    """[start, end) in Unix seconds."""

    start: float = float("-inf")
    end: float = float("inf")

    def covers(self, lo: float, hi: float) -> bool:
        """Whether [lo, hi) lies inside the range."""
        return self.start <= lo and hi <= self.end

    def meets(self, lo: float, hi: float) -> bool:
        """Whether [lo, hi) and the range overlap."""
        return lo < self.end and self.start < hi

    def describe(self) -> dict:
        def iso(t: float) -> str | None:
            return None if abs(t) == float("inf") else _iso(t)

        return {"start": iso(self.start), "end": iso(self.end)}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def parse_time(text: str) -> float:
    """Unix seconds, or an ISO 8601 date-time (UTC unless it ends in Z or names an offset)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    body, offset = text, 0
    if body.endswith("Z"):
        body = body[:-1]
    elif len(body) > 6 and body[-6] in "+-" and body[-3] == ":":
        sign = 1 if body[-6] == "+" else -1
        offset = sign * (int(body[-5:-3]) * 3600 + int(body[-2:]) * 60)
        body = body[:-6]
    for fmt in _TIME_FORMATS:
        try:
            return calendar.timegm(time.strptime(body, fmt)) - offset
        except ValueError:
            continue
    raise ValueError(f"not a time: {text!r} (Unix seconds or ISO 8601, e.g. 2026-12-05T14:00Z)")


def time_range(since: str | None = None, between: tuple[str, str] | None = None,
               now: float | None = None) -> TimeRange:  # fmt: skip
    """`--since DURATION` (up to now) or `--between START END`; neither: everything."""
    if since is not None and between is not None:
        raise ValueError("--since and --between are two ways to say one range: give one")
    if since is not None:
        end = time.time() if now is None else now
        return TimeRange(end - parse_duration(since), float("inf"))
    if between is not None:
        start, end = (parse_time(t) for t in between)
        if not end > start:
            raise ValueError(f"--between {between[0]} {between[1]}: the end is not after the start")
        return TimeRange(start, end)
    return TimeRange()


def streams(root: Path, rng: TimeRange, nodes: tuple[str, ...] = (),
            ranks: tuple[int, ...] = ()) -> dict[tuple[str, int], list[Path]]:  # fmt: skip
    """The store's hours that meet the range, per (node directory, rank), oldest first."""
    out: dict[tuple[str, int], list[Path]] = {}
    for node in sorted(root.glob("node=*")):
        name = node.name.removeprefix("node=")
        if (nodes and name not in nodes) or not node.is_dir() or node.is_symlink():
            continue
        for rank_dir in sorted(node.glob("rank=*")):
            try:
                rank = int(rank_dir.name.removeprefix("rank="))
            except ValueError:
                continue
            if ranks and rank not in ranks:
                continue
            hours = []
            for hour_dir in rank_dir.glob("hour=*"):
                key = segment_of(hour_dir.name)
                if key is None or not (hour_dir / MANIFEST).is_file():
                    continue
                if rng.meets(key[0] * PARTITION_SECONDS, (key[0] + 1) * PARTITION_SECONDS):
                    hours.append((key, hour_dir))
            if hours:
                out[(name, rank)] = [d for _, d in sorted(hours)]
    return out


def _link(src: Path, dst: Path) -> None:
    """A hard link to a published part (or record); a copy where no link can be made."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


class _ViewWriter:
    """Parts of one view, numbered in order, from whole parts (linked) or kept rows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.number = 0
        self.steps = 0
        self.request_steps = 0

    def add_part(self, links: dict[str, Path], frames: dict[str, pl.DataFrame]) -> None:
        """One part: tables linked whole, and tables written from kept rows."""
        if not links and not frames:
            return
        for table, src in links.items():
            dst = self.path / table / part_name(self.number)
            _link(src, dst)
            _link(checksum_path(src), checksum_path(dst))
        for table, df in frames.items():
            publish_part(self.path / table / part_name(self.number), df)
        self.number += 1


def _count(path: Path) -> int:
    return pl.scan_parquet(str(path)).select(pl.len()).collect().item()


@dataclass
class _Hour:
    path: Path
    whole: bool  # every step of the hour is inside the range
    parts: dict[int, dict[str, Path]]  # part number -> table -> file


def _hours(paths: list[Path], rng: TimeRange) -> tuple[list[_Hour], list[dict]]:
    hours, manifests = [], []
    for path in paths:
        run = open_run(path)
        manifests.append(run.manifest)
        h = hour_of(path.name)
        parts: dict[int, dict[str, Path]] = {}
        for table in run.tables():
            files = dict(list_parts(path / table))
            run.check_parts(table, list(files.values()))
            for number, f in files.items():
                parts.setdefault(number, {})[table] = f
        if REQUESTS in run.tables():  # as a run reads them: none without its steps part
            for number in [n for n, t in parts.items() if REQUESTS in t and STEPS not in t]:
                del parts[number][REQUESTS]
        whole = rng.covers(h * PARTITION_SECONDS, (h + 1) * PARTITION_SECONDS)
        hours.append(_Hour(path, whole, dict(sorted(parts.items()))))
    return hours, manifests


def _in_range(steps: pl.DataFrame, rng: TimeRange, where: Path) -> pl.DataFrame:
    if STEP_TIME not in steps.columns:
        raise RunStoreError(f"{where}: no step times; a store's range cannot cut it")
    t = pl.col(STEP_TIME)
    return steps.filter((t >= rng.start) & (t < rng.end))


def _view(paths: list[Path], rng: TimeRange, into: Path, node: str) -> Path:
    """One stream's hours in the range as one run directory at `into`.

    Steps and their request rows are kept by when the step was stored; the rows of other
    tables (the estimator's `ceilings`, written when a walk ended, often in a later part or
    hour) by the step they name, over the whole range. Where the range covers every hour,
    every part is linked as it is."""
    into.mkdir(parents=True)
    hours, manifests = _hours(paths, rng)
    writer = _ViewWriter(into)
    everything = all(h.whole for h in hours)
    kept_keys = None if everything else _kept_keys(hours, rng)
    for hour in hours:
        for tables in hour.parts.values():
            steps, requests = tables.get(STEPS), tables.get(REQUESTS)
            if steps is not None and hour.whole:
                writer.steps += _count(steps)
                writer.request_steps += _count(requests) if requests is not None else 0
                pair = {STEPS: steps} | ({REQUESTS: requests} if requests is not None else {})
                frames: dict[str, pl.DataFrame] = {}
            elif steps is not None:
                kept = _in_range(pl.read_parquet(steps), rng, steps)
                frames = {STEPS: kept} if kept.height else {}
                if kept.height and requests is not None:
                    frames[REQUESTS] = pl.read_parquet(requests).join(
                        kept.select(STEP_KEY), on=list(STEP_KEY), how="semi"
                    )
                writer.steps += kept.height
                writer.request_steps += frames[REQUESTS].height if REQUESTS in frames else 0
                pair = {}
            else:
                pair, frames = {}, {}
            others = {t: f for t, f in tables.items() if t not in (STEPS, REQUESTS)}
            if everything:
                pair |= others
            else:
                for table, f in others.items():
                    df = pl.read_parquet(f)
                    if all(k in df.columns for k in STEP_KEY):
                        df = df.join(kept_keys, on=list(STEP_KEY), how="semi")
                    if df.height:
                        frames[table] = df
            writer.add_part(pair, frames)
    manifest = dict(manifests[0])
    manifest.update(
        steps=writer.steps,
        request_steps=writer.request_steps,
        parts=writer.number,
        complete=True,
        instance=node,
        source=f"store:{node}",
        time_range=rng.describe(),
        hours=[m.get("hour") for m in manifests],
        hours_complete=all(m.get("complete") is True for m in manifests),
    )
    for key in ("dropped_steps", "interrupted"):
        manifest.pop(key, None)
    (into / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return into


def _kept_keys(hours: list[_Hour], rng: TimeRange) -> pl.DataFrame:
    """The step keys of every step of the stream inside the range."""
    frames = []
    for hour in hours:
        for tables in hour.parts.values():
            steps = tables.get(STEPS)
            if steps is None:
                continue
            df = pl.read_parquet(steps, columns=[*STEP_KEY, STEP_TIME] if not hour.whole
                                 else list(STEP_KEY))  # fmt: skip
            if not hour.whole:
                df = _in_range(df, rng, steps).select(STEP_KEY)
            frames.append(df)
    return (
        pl.concat(frames)
        if frames
        else pl.DataFrame(schema={"rank": pl.Int64, "forward_ct": pl.Int64})
    )


@contextlib.contextmanager
def store_views(root: Path, rng: TimeRange, nodes: tuple[str, ...] = (),
                ranks: tuple[int, ...] = ()) -> Iterator[list[Path]]:  # fmt: skip
    """The range's streams as run directories, removed when the block ends."""
    if not is_store(root):
        raise RunStoreError(f"{root}: not a dspark-obs store (no {STORE_MARKER})")
    found = streams(root, rng, nodes, ranks)
    if not found:
        raise RunStoreError(
            f"{root}: no stored hour in {rng.describe()}"
            + (f" for node {', '.join(nodes)}" if nodes else "")
            + (f" rank {', '.join(map(str, ranks))}" if ranks else "")
        )
    try:
        (root / VIEWS).mkdir(exist_ok=True)
        base = Path(tempfile.mkdtemp(dir=root / VIEWS))
    except OSError:  # a store this user cannot write: copies in a temporary directory
        base = Path(tempfile.mkdtemp(prefix="dspark-obs-view-"))
    try:
        yield [
            _view(hours, rng, base / f"{node}-rank{rank}", node)
            for (node, rank), hours in found.items()
        ]
    finally:
        shutil.rmtree(base, ignore_errors=True)
