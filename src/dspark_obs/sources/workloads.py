"""Which workload a request belongs to, for sources that only know its rid.

SGLang's records carry no workload. Operators name it either in the rid (a
regular expression with a named group `workload`, e.g. `^(?P<workload>[a-z]+)-`)
or in a JSONL side file of `{"rid": ..., "workload": ...}` lines. Given neither, a rid
of the form `NAME-N` (`gsm8k-17`: a name that starts with a letter and holds no dash, a
dash, digits) names its workload, the way benchmark and replay tools number requests;
SGLang's own rids (UUIDs) never match it. Anything else counts as `other`. Lookups are
cached per rid, so a request costs one match over its whole life, not one per step.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from itertools import compress
from pathlib import Path

import numpy as np

from ..json_files import decode_document, read_input_file

OTHER = "other"
#: The rule without --workload-from-rid or --workload-file: `NAME-N` rids.
DEFAULT_RID_PATTERN = r"^(?P<workload>[A-Za-z][A-Za-z0-9_.]*)-\d+$"
_CACHE_LIMIT = 1 << 16


def workload_rule(
    pattern: str | None = None, side_file: str | Path | None = None
) -> Callable[[np.ndarray], np.ndarray]:
    """A `workload_of(rids) -> names` function for the SGLang converters (with neither
    argument, `DEFAULT_RID_PATTERN`)."""
    if pattern is None and side_file is None:
        pattern = DEFAULT_RID_PATTERN
    regex = None
    if pattern is not None:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"--workload-from-rid {pattern!r}: {exc}") from None
        if "workload" not in regex.groupindex:
            raise ValueError(
                f"--workload-from-rid {pattern!r}: needs a named group (?P<workload>...)"
            )
    table: dict[str, str] = {}
    if side_file is not None:
        table = _read_side_file(Path(side_file))
    cache: dict[str, str] = {}

    def one(rid: str) -> str:
        name = table.get(rid)
        if name is None and regex is not None:
            m = regex.search(rid)
            name = m.group("workload") if m and m.group("workload") else None
        return name or OTHER

    def workload_of(rids: np.ndarray) -> np.ndarray:
        keys = rids.tolist()
        # one C-level pass over the cache; Python runs only for rids not seen before
        names = list(map(cache.get, keys))
        if None in names:
            # Python runs for the new rids only, not for every row (a poll of 50 steps
            # at B=256 holds 12,800 rows and a few dozen new requests)
            new = dict.fromkeys(compress(keys, map(operator.not_, names)))
            if len(cache) + len(new) > _CACHE_LIMIT:
                cache.clear()
            for rid in new:
                cache[rid] = one(str(rid))
            names = list(map(cache.get, keys))
        out = np.empty(len(names), dtype=object)
        out[:] = names
        return out

    return workload_of


def _read_side_file(path: Path) -> dict[str, str]:
    """The rid -> workload table of a JSONL side file: a regular file of at most
    `MAX_INPUT_BYTES`, each line one flat object read with its nesting bounded and no key
    given twice (json_files)."""
    table: dict[str, str] = {}
    data = read_input_file(path, "workload file")
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = decode_document(line)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
            rid, workload = obj["rid"], obj["workload"]
            if not isinstance(rid, (str, int)) or not isinstance(workload, str):
                raise ValueError("rid and workload must be a string (or a number for rid)")
            table[str(rid)] = workload
        except (ValueError, KeyError) as exc:
            raise ValueError(
                f'workload file {path}, line {n}: expected {{"rid": ..., "workload": ...}} ({exc})'
            ) from None
    return table
