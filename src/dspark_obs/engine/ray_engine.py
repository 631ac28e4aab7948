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

from .base import MapFn, PartitionRead, Unread, read_partition
from .partitions import Partition

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
        self._options = {"num_cpus": 1, "max_retries": max_retries}

    def map(
        self, fn: MapFn, partitions: list[Partition], args: tuple = ()
    ) -> list[PartitionRead | Unread]:
        declared = self._ray.cluster_resources()
        refs = []
        for p in partitions:
            key = NODE_RESOURCE.format(p.node)
            placed = {"resources": {key: _SLIVER}} if key in declared else {}
            refs.append(self._task.options(**self._options, **placed).remote(fn, p, args))
        try:
            return self._ray.get(refs)
        except self._ray.exceptions.RayTaskError as exc:
            # the analysis' own error, as the in-process engine would raise it
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            raise
