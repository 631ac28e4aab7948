"""The engine API: run one function over partitions, each result a partial or a named
failure; and the in-process engine.

A partition that cannot be read (missing, damaged, unreachable) comes back as `Unread`
naming it and why, so a command can count it and print it, or refuse (`--strict`); it is
never left out in silence. Any other error is the command's and propagates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ..store.errors import READ_ERRORS, RunStoreError
from ..store.fleet import node_of
from .partitions import Discover, Partition, opened

#: A partition's map: (run, its node, *args) -> its partial figures.
MapFn = Callable[..., Any]


@dataclass(frozen=True)
class PartitionRead:
    """One partition's partial figures, with what the fleet's header says of its run."""

    path: str
    node: str
    manifest: dict
    partial: Any
    #: the engine's name for the machine that read it (Ray's node id; None in process)
    read_on: str | None = None


@dataclass(frozen=True)
class Unread:
    """A partition that could not be read: its path and the reason, on one line."""

    path: str
    error: str


def read_partition(fn: MapFn, partition: Partition, args: tuple) -> PartitionRead | Unread:
    """`fn` over one partition where this runs; a read failure as `Unread`."""
    try:
        with opened(partition) as run:
            node = node_of(run.manifest, partition.label)
            partial = fn(run, node, *args)
            return PartitionRead(partition.path, node, dict(run.manifest), partial)
    except (RunStoreError, *READ_ERRORS) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Unread(partition.path, first)


class Engine(Protocol):
    name: str
    #: lists a path this process cannot see on the engine's nodes (None: it is an error)
    discover: Discover | None

    def imap(
        self, fn: MapFn, partitions: list[Partition], args: tuple = ()
    ) -> Iterator[PartitionRead | Unread]:
        """`read_partition(fn, p, args)` for every partition, yielded in their order, so
        a caller can fold each partial in and drop it before the next arrives."""

    def map(
        self, fn: MapFn, partitions: list[Partition], args: tuple = ()
    ) -> list[PartitionRead | Unread]:
        """`imap`'s results as a list."""


class InProcessEngine:
    """Every partition read here, one after another: the fleet commands' own path."""

    name = "local"
    discover = None

    def imap(
        self, fn: MapFn, partitions: list[Partition], args: tuple = ()
    ) -> Iterator[PartitionRead | Unread]:
        return (read_partition(fn, p, args) for p in partitions)

    def map(
        self, fn: MapFn, partitions: list[Partition], args: tuple = ()
    ) -> list[PartitionRead | Unread]:
        return list(self.imap(fn, partitions, args))
