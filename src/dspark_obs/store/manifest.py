"""Reading `run.json` once, validated in one place, so no reader trusts a bad value.

Every command reads the manifest through `read_manifest`; a value no writer writes
(`gamma: -1`, a count that is not a whole number, a nesting 100,000 levels deep) is
a RunStoreError naming the file and the key here, not a traceback (or a printed
`gamma=-1`) in whichever command met it first. Keys a writer may leave out stay
optional; keys this version does not know are kept as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..json_files import decode_json
from ..telemetry.batch import MAX_GAMMA
from .errors import RunStoreError
from .files import read_regular

#: A manifest is a few kilobytes (the cost table and the config included).
MAX_MANIFEST_BYTES = 16 << 20
_COUNTS = ("steps", "request_steps", "parts", "dropped_steps", "store_version")
_FLAGS = ("complete", "interrupted")
_TEXTS = (
    "mode", "source", "timing", "shadow", "created", "world", "target", "instance", "host",
    "engine", "model_name",
)  # fmt: skip


def _problem(manifest: dict[str, Any]) -> str | None:
    """What is wrong with a parsed manifest, in words, or None."""
    gamma = manifest.get("gamma")
    if gamma is not None and not (type(gamma) is int and 1 <= gamma <= MAX_GAMMA):
        return f"gamma is {gamma!r}, expected an integer in 1..{MAX_GAMMA}"
    for key in _COUNTS:
        value = manifest.get(key)
        if value is not None and not (type(value) is int and value >= 0):
            return f"{key} is {value!r}, expected a whole number >= 0"
    for key in _FLAGS:
        value = manifest.get(key)
        if value is not None and type(value) is not bool:
            return f"{key} is {value!r}, expected true or false"
    for key in _TEXTS:
        value = manifest.get(key)
        if value is not None and not isinstance(value, str):
            return f"{key} is {value!r}, expected a string"
    workloads = manifest.get("workloads")
    if workloads is not None and not (
        isinstance(workloads, list) and all(isinstance(w, str) for w in workloads)
    ):
        return "workloads is not a list of names"
    for key in ("config", "sts", "cost_table", "versions"):
        value = manifest.get(key)
        if value is not None and not isinstance(value, dict):
            return f"{key} is {type(value).__name__}, expected an object"
    return None


def identity(manifest: dict[str, Any]) -> tuple[str, str]:
    """The engine and the model a run observed (what serves it labels every series with):
    as `run.json` says, or, in runs written before it said, the reference runtime's world
    or an SGLang server's unknown model."""
    world = manifest.get("world")
    runtime = world is not None or manifest.get("source") in ("runtime", "serve:runtime")
    engine = manifest.get("engine") or ("reference" if runtime else "sglang")
    default = f"dspark-obs/{world or 'reference'}" if engine == "reference" else "unknown"
    return engine, manifest.get("model_name") or default


def read_manifest(path: Path) -> dict[str, Any]:
    """The parsed and validated `run.json`, or a RunStoreError naming the file."""
    try:
        raw = read_regular(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise RunStoreError(f"{path}: missing run manifest (not a run directory?)") from None
    except OSError as exc:
        raise RunStoreError(f"{path}: unreadable run manifest: {exc.strerror or exc}") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise RunStoreError(f"{path}: run manifest larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = decode_json(raw)
    except ValueError as exc:
        raise RunStoreError(f"{path}: corrupt run manifest: {exc}") from None
    if not isinstance(manifest, dict):
        raise RunStoreError(f"{path}: run manifest is not a JSON object")
    problem = _problem(manifest)
    if problem:
        raise RunStoreError(f"{path}: invalid run manifest: {problem}")
    return manifest
