"""Many run directories read as one fleet: which runs, which node each stands for, and
whether they can be merged at all.

Post-hoc commands fold each run into sums and add the sums (`analysis/fleet_summary.py`,
`analysis/reliability.py`, `estimator/fleet.py`), so nothing here reads rows. What is
decided here once, for every command: a path is a run (it holds `run.json`) or a directory
of runs (its subdirectories that hold one); each run's *node* is the manifest's `instance`
or `host` when it records one, else its directory name (with its parent's where two names
collide); and runs whose block size differs, or whose verify modes differ while the figures
would pool them, are refused, because their rows do not mean the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import RunStoreError
from .inventory import MANIFEST
from .reader import Run, not_a_run_dir, open_run

#: Manifest keys naming the machine a run was recorded on, in order of preference.
NODE_KEYS = ("instance", "host")

#: What a fleet's figures may be grouped by besides the workload.
GROUP_KEYS = ("node", "rank", "mode")


def run_labels(paths: list[Path]) -> list[str]:
    """Short, unique labels: the directory name, with its parent where names collide."""
    names = [p.resolve().name for p in paths]
    labels = []
    for p, name in zip(paths, names, strict=True):
        label = name if names.count(name) == 1 else f"{p.resolve().parent.name}/{name}"
        while label in labels:
            label += "'"
        labels.append(label)
    return labels


def expand_run_dirs(paths: list[Path]) -> list[Path]:
    """Each path as itself when it is a run, or as the runs directly inside it, sorted.

    A RunStoreError names a path that is neither, and a run given twice (it would count
    twice).
    """
    out: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise not_a_run_dir(path)
        if (path / MANIFEST).exists():
            out.append(path)
            continue
        inner = sorted(p for p in path.iterdir() if p.is_dir() and (p / MANIFEST).exists())
        if not inner:
            raise RunStoreError(
                f"{path}: neither a run directory (no {MANIFEST}) nor a directory of runs"
            )
        out += inner
    seen: dict[Path, Path] = {}
    for path in out:
        key = path.resolve()
        if key in seen:
            raise RunStoreError(f"{path}: given twice (also as {seen[key]}); it would count twice")
        seen[key] = path
    return out


class FleetMismatchError(RunStoreError):
    """Runs that are each readable but whose rows do not mean the same thing together."""


@dataclass(frozen=True)
class FleetHead:
    """What a fleet's figures say about its runs besides their rows: each run's path, node
    and manifest. The fold's partial figures of each run travel with it, so a fleet read
    elsewhere (`dspark_obs.engine`) is merged and described as one read here."""

    paths: list[str]
    nodes: list[str]
    manifests: list[dict]

    @property
    def gamma(self) -> int:
        return self.manifests[0]["gamma"]

    @property
    def run(self) -> str | None:
        """The one run's path, None for several."""
        return self.paths[0] if len(self.paths) == 1 else None

    def common(self, key: str) -> object:
        """A manifest value every run shares, else None."""
        values = {repr(m.get(key)) for m in self.manifests}
        return self.manifests[0].get(key) if len(values) == 1 else None

    def describe(self) -> list[dict]:
        return [{"path": p, "node": n} for p, n in zip(self.paths, self.nodes, strict=True)]


@dataclass(frozen=True)
class Fleet:
    """Runs opened for reading, each with the node it stands for."""

    runs: list[Run]
    nodes: list[str]

    @property
    def head(self) -> FleetHead:
        return FleetHead(
            [str(r.path) for r in self.runs], self.nodes, [r.manifest for r in self.runs]
        )

    @property
    def gamma(self) -> int:
        return self.runs[0].gamma

    def common(self, key: str) -> object:
        """A manifest value every run shares, else None."""
        return self.head.common(key)

    def describe(self) -> list[dict]:
        return self.head.describe()


def node_of(manifest: dict, label: str) -> str:
    """The node a run stands for: its manifest's `instance` or `host`, else `label`."""
    for key in NODE_KEYS:
        value = manifest.get(key)
        if isinstance(value, str) and value:
            return value
    return label


def _holds_runs(path: Path) -> bool:
    return path.is_dir() and any((p / MANIFEST).exists() for p in path.iterdir() if p.is_dir())


def single_run(paths: list[Path], by: tuple[str, ...]) -> bool:
    """One path that is not a directory of runs, and no grouping: the commands' single-run
    form, as before fleets (and its messages for a path that is no run)."""
    return len(paths) == 1 and not by and not _holds_runs(paths[0])


def parse_group_keys(text: str | None) -> tuple[str, ...]:
    """`--by node,rank` as a tuple, refusing a key no fleet figure is grouped by."""
    if not text:
        return ()
    keys = tuple(k.strip() for k in text.split(","))
    bad = [k for k in keys if k not in GROUP_KEYS]
    if bad or len(set(keys)) != len(keys):
        raise ValueError(f"--by {text!r}: expected distinct keys among {', '.join(GROUP_KEYS)}")
    return keys


def open_fleet(paths: list[Path], by: tuple[str, ...] = ()) -> Fleet:
    """The runs under `paths` as one fleet; a RunStoreError when they cannot be merged.

    Every run must share one gamma (the per-position columns are gamma wide, and a
    position means a different thing in another block size). Runs recorded in different
    verify modes are refused unless the figures are split by `mode` (`by`): a pooled
    utilisation or calibration of compact and static rows answers no one's question.
    """
    dirs = expand_run_dirs(paths)
    runs = [open_run(p) for p in dirs]
    check_mergeable([str(r.path) for r in runs], [r.manifest for r in runs], by)
    nodes = [node_of(r.manifest, label) for r, label in zip(runs, run_labels(dirs), strict=True)]
    return Fleet(runs=runs, nodes=nodes)


def check_mergeable(paths: list[str], manifests: list[dict], by: tuple[str, ...]) -> None:
    """A FleetMismatchError (or RunStoreError) where the runs cannot be merged (`open_fleet`)."""
    gammas = {p: m.get("gamma") for p, m in zip(paths, manifests, strict=True)}
    if None in gammas.values():
        missing = next(p for p, g in gammas.items() if g is None)
        raise RunStoreError(f"{Path(missing) / MANIFEST}: no gamma (the run holds no steps?)")
    if len(set(gammas.values())) > 1:
        listed = ", ".join(f"{p} gamma {g}" for p, g in gammas.items())
        raise FleetMismatchError(f"runs of different gamma cannot be merged: {listed}")
    modes = {p: m.get("mode") for p, m in zip(paths, manifests, strict=True)}
    if len(set(modes.values())) > 1 and "mode" not in by:
        listed = ", ".join(f"{p} {m}" for p, m in modes.items())
        raise FleetMismatchError(
            f"runs of different verify modes cannot be pooled: {listed}; "
            "add --by mode to keep them apart"
        )
