"""A fleet's partitions: one run directory each, on a local (or shared) path, on a path
only some nodes hold, or on any filesystem pyarrow opens (`file://`, `s3://`, `gs://`,
`hdfs://`).

The driver lists the partitions it can see and reads each one's `run.json` (for its node,
which decides where its task runs); a local path the driver cannot see is listed by the
engine's nodes instead (`discover`: each node lists it where it is, and its runs are read
there). The rows are read only by the task (`opened`). A run behind a URI is copied by
the task into its own scratch directory and read there, so it crosses the network to a
worker, never to the driver.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..store.errors import RunStoreError
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
    #: the engine's node that found it where the driver could not see it (read only there)
    found_on: str | None = None


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


def visible_here(path: str | Path) -> bool:
    """Whether this process can list `path` (else the engine's nodes are asked)."""
    return Path(path).exists()


def runs_here(path: str) -> list[tuple[str, dict]]:
    """(directory, manifest) of the runs at or directly under `path` on this machine, none
    where it holds no run: what a node answers when asked for a path (`discover`)."""
    try:
        dirs = expand_run_dirs([Path(path)])
    except (OSError, RunStoreError):
        return []
    return [(str(d), json.loads((d / MANIFEST).read_text(encoding="utf-8"))) for d in dirs]


#: `discover(path)`: the partitions the engine's nodes find under a path the driver cannot see.
Discover = Callable[[str], list[Partition]]


def partitions_of(paths: list[str | Path], discover: Discover | None = None) -> list[Partition]:
    """Every run under `paths` as a partition, in the order the in-process fleet reads
    them (a directory's runs sorted); a run given twice is refused, as there. A local path
    this process cannot see is `discover`ed on the engine's nodes where there is one."""
    out: list[Partition] = []
    seen = [Path(p) for p in paths if as_uri(p) is None and visible_here(p)]
    dirs = expand_run_dirs(seen) if seen else []
    labels = iter(run_labels(dirs))
    for path in paths:
        uri = as_uri(path)
        if uri is None and discover is not None and not visible_here(path):
            found = discover(str(path))
            if not found:
                raise RunStoreError(f"{path}: no run there on this machine or any node")
            out += found
        elif uri is None:
            for d in expand_run_dirs([Path(path)]):
                label = next(labels)
                manifest = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
                out.append(Partition(str(d), label, node_of(manifest, label)))
        else:
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
