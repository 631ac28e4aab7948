"""Where a fleet's runs are read: in this process, or on a Ray cluster.

Every fleet figure is a map (one run, or one (node, rank) of a store, into mergeable
partial figures: sums, counts, histograms) and a reduce (the partials added, then the
figures). The map and the reduce are the analysis modules' own (`analysis.summary`,
`analysis.reliability`, `estimator.fleet`); an engine only decides where the map runs.
`base.InProcessEngine` runs it here, one partition after another; `ray_engine.RayEngine`
runs one Ray task per partition, on the node that holds it, and brings back only the
partials. `jobs` puts a command's map and reduce together over either engine.
"""

from .base import Engine, InProcessEngine, Partition, PartitionRead, Unread
from .partitions import partitions_of

__all__ = ["Engine", "InProcessEngine", "Partition", "PartitionRead", "Unread", "partitions_of"]


def make_engine(name: str, address: str | None = None) -> Engine:
    """The engine `--engine NAME` names; `ray` needs the `dspark-obs[ray]` extra."""
    if name == "ray":
        from .ray_engine import RayEngine

        return RayEngine(address)
    if name == "local":
        return InProcessEngine()
    raise ValueError(f"--engine {name!r}: expected local or ray")
