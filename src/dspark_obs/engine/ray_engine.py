"""The Ray engine: one task per partition, on the node that holds it, partials back.

`--ray-address` joins a running cluster (`ray start --head`, or `auto`); without it Ray
joins the cluster `RAY_ADDRESS` or a local `ray start` names, else starts one in this
process's machine. A node declares the fleet nodes whose runs it holds as custom resources
(`ray start --resources '{"dspark_node:NAME": 1}'`): a partition of node NAME is then
scheduled only there (a sliver of that resource, so any number of its tasks fit). A
partition of a node no Ray node declares runs anywhere (a shared filesystem or a URI).

A task whose worker dies (killed, out of memory, its node lost) is run again, up to
`max_retries` times; an error of the analysis itself is not retried (it would fail
again) and reaches the driver as the command's error.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from ..store.fleet import node_of, run_labels
from .base import MapFn, PartitionRead, Unread, read_partition
from .partitions import Partition, runs_here

#: The custom resource a Ray node holding fleet node NAME's runs declares.
NODE_RESOURCE = "dspark_node:{}"
#: How much of it a task asks for: a sliver, so a node runs its partitions CPU-bound only.
_SLIVER = 0.001


def _read_here(fn: MapFn, partition: Partition, args: tuple) -> PartitionRead | Unread:
    """`read_partition` stamped with the Ray node that ran it."""
    import dataclasses

    import ray

    out = read_partition(fn, partition, args)
    if isinstance(out, PartitionRead):
        return dataclasses.replace(out, read_on=ray.get_runtime_context().get_node_id())
    return out


class RayEngine:
    name = "ray"

    def __init__(self, address: str | None = None, max_retries: int = 3) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        self._ray = ray
        self._task = ray.remote(_read_here)
        self._runs_here = ray.remote(runs_here)
        self._options = {"num_cpus": 1, "max_retries": max_retries}

    def imap(
        self, fn: MapFn, partitions: list[Partition], args: tuple = ()
    ) -> Iterator[PartitionRead | Unread]:
        """Every task submitted at once; results fetched in order, each dropped from the
        object store once the caller moves past it."""
        declared = self._ray.cluster_resources()
        refs = deque()
        for p in partitions:
            key = NODE_RESOURCE.format(p.node)
            if p.found_on is not None:
                placed = {"scheduling_strategy": self._pinned(p.found_on)}
            else:
                placed = {"resources": {key: _SLIVER}} if key in declared else {}
            refs.append(self._task.options(**self._options, **placed).remote(fn, p, args))
        while refs:
            yield self._get(refs.popleft())

    def _pinned(self, node_id: str):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return NodeAffinitySchedulingStrategy(node_id, soft=False)

    def discover(self, path: str) -> list[Partition]:
        """The runs at `path` on each Ray node that runs tasks, each to be read where found."""
        nodes = [n for n in self._ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1]
        answers = self._ray.get(
            [
                self._runs_here.options(
                    num_cpus=0, scheduling_strategy=self._pinned(n["NodeID"])
                ).remote(path)
                for n in nodes
            ]
        )
        found: dict[str, tuple[str, dict, str, bool]] = {}
        for n, runs in zip(nodes, answers, strict=True):
            names = {k.split(":", 1)[1] for k in n["Resources"] if k.startswith("dspark_node:")}
            for run_dir, manifest in runs:
                owner = node_of(manifest, Path(run_dir).name) in names
                key = run_dir + "\0" + json.dumps(manifest, sort_keys=True, default=str)
                if key not in found or (owner and not found[key][3]):
                    found[key] = (run_dir, manifest, n["NodeID"], owner)
        runs = sorted(found.values(), key=lambda r: r[0])
        labels = run_labels([Path(r[0]) for r in runs])
        return [
            Partition(run_dir, label, node_of(manifest, label), found_on=node_id)
            for (run_dir, manifest, node_id, _), label in zip(runs, labels, strict=True)
        ]

    def map(
        self, fn: MapFn, partitions: list[Partition], args: tuple = ()
    ) -> list[PartitionRead | Unread]:
        return list(self.imap(fn, partitions, args))

    def _get(self, ref):
        """The task's result, the analysis' own error raised as such. Arrays Ray returns
        are views of its object store, read-only; a reduce adds into partials in place
        (histograms), so the driver holds its own copy (partials are small)."""
        try:
            return copy.deepcopy(self._ray.get(ref))
        except self._ray.exceptions.RayTaskError as exc:
            # the analysis' own error, as the in-process engine would raise it
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            raise
