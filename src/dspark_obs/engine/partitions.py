"""A fleet's partitions: one run directory each, on a local (or shared) path or on any
filesystem pyarrow opens (`file://`, `s3://`, `gs://`, `hdfs://`).

The driver lists the partitions and reads each one's `run.json` (for its node, which
decides where its task runs); the rows are read only by the task (`opened`). A run behind
a URI is copied by the task into its own scratch directory and read there, so it crosses
the network to a worker, never to the driver.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..store.fleet import expand_run_dirs, node_of, run_labels
from ..store.inventory import MANIFEST
from ..store.reader import Run, open_run

#: `scheme://rest`, also as a `Path` leaves it (`scheme:/rest`: one slash folded away).
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/+(.*)$")


@dataclass(frozen=True)
class Partition:
    """One run directory of a fleet: where it is, its label, and the node it stands for."""

    path: str
    label: str
    node: str


def as_uri(path: str | Path) -> str | None:
    """The URI `path` spells (restoring what `Path` folded), None for a plain path."""
    m = _URI.match(str(path))
    if m is None:
        return None
    scheme, rest = m.group(1).lower(), m.group(2)
    return f"file:///{rest}" if scheme == "file" else f"{scheme}://{rest}"


def _filesystem(uri: str):
    from pyarrow import fs

    return fs.FileSystem.from_uri(uri)


def _uri_runs(uri: str) -> list[tuple[str, dict]]:
    """(URI, manifest) of the run at `uri` or of the runs directly inside it."""
    from pyarrow import fs

    filesystem, root = _filesystem(uri)
    base = uri[: len(uri) - len(root)] if uri.endswith(root) else uri.rsplit(root, 1)[0]

    def manifest(path: str) -> dict | None:
        info = filesystem.get_file_info(f"{path}/{MANIFEST}")
        if info.type != fs.FileType.File:
            return None
        with filesystem.open_input_stream(f"{path}/{MANIFEST}") as f:
            return json.loads(f.read())

    own = manifest(root)
    if own is not None:
        return [(uri, own)]
    listing = filesystem.get_file_info(fs.FileSelector(root, allow_not_found=True))
    runs = []
    for info in sorted(listing, key=lambda i: i.path):
        if info.type == fs.FileType.Directory and (m := manifest(info.path)) is not None:
            runs.append((base + info.path, m))
    if not runs:
        raise FileNotFoundError(f"{uri}: neither a run directory nor a directory of runs")
    return runs


def partitions_of(paths: list[str | Path]) -> list[Partition]:
    """Every run under `paths` as a partition, in the order the in-process fleet reads
    them (a directory's runs sorted); a run given twice is refused, as there."""
    out: list[Partition] = []
    local = [Path(p) for p in paths if as_uri(p) is None]
    dirs = expand_run_dirs(local) if local else []
    labels = iter(run_labels(dirs))
    for path in paths:
        uri = as_uri(path)
        if uri is None:
            for d in expand_run_dirs([Path(path)]):
                label = next(labels)
                manifest = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
                out.append(Partition(str(d), label, node_of(manifest, label)))
            continue
        for run_uri, manifest in _uri_runs(uri):
            label = run_uri.rstrip("/").rsplit("/", 1)[-1]
            out.append(Partition(run_uri, label, node_of(manifest, label)))
    return out


@contextlib.contextmanager
def opened(partition: Partition) -> Iterator[Run]:
    """The partition's run opened where this runs: in place, or copied from its URI into
    a scratch directory removed afterwards."""
    uri = as_uri(partition.path)
    if uri is None:
        yield open_run(partition.path)
        return
    from pyarrow import fs

    filesystem, root = _filesystem(uri)
    scratch = Path(tempfile.mkdtemp(prefix="dspark-partition-"))
    try:
        local = scratch / "run"
        fs.copy_files(root, str(local), source_filesystem=filesystem)
        yield open_run(local)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
