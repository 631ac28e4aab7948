"""The source interface and `--source` parsing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from ..telemetry import StepBatch


class Source(Protocol):
    name: str
    gamma: int

    def batches(self, stop: threading.Event) -> Iterator[StepBatch]: ...


def parse_source(spec: str) -> tuple[str, str | None]:
    """`runtime`, `run:RUN_DIR` or `sglang:URL` -> (kind, argument)."""
    if spec == "runtime":
        return "runtime", None
    kind, sep, arg = spec.partition(":")
    if kind == "run" and sep and arg:
        if not Path(arg).is_dir():
            raise ValueError(f"--source {spec}: {arg} is not a directory")
        return "run", arg
    if kind == "sglang" and sep and arg.startswith(("http://", "https://")):
        if "@" in urlsplit(arg).netloc:
            # user:password@ would be echoed in logs, the source label and the run manifest
            raise ValueError(
                "--source sglang:URL: credentials in the URL are not supported (they would "
                "show in logs and metric labels); use --sglang-api-key-file"
            )
        return "sglang", arg
    raise ValueError(
        f"--source {spec!r}: expected 'runtime', 'run:RUN_DIR' or 'sglang:http(s)://HOST:PORT'"
    )
