"""The real world's texts: three workloads cut from the Python standard library's own files.

- `code`: the library's `.py` sources (tests and site-packages left out);
- `docs`: the English reference text of `pydoc_data/topics.py` (the strings, not the code);
- `changelog`: IDLE's release notes (`idlelib/NEWS.txt`, `NEWS2x.txt`, `HISTORY.txt`),
  terse dated entries naming issues and people.

Every workload is a list of units (a file, a topic, a paragraph) with a stable key; a unit
is held out when the CRC-32 of its key falls in a fixed residue class, so training on a
library never sees the held-out units, whatever else differs. The first `HELDOUT_BYTES` of
the held-out units (at most 4 KB of each, in CRC order) are committed with the package
(`data/heldout-<workload>.bin`): the held-out loss and the prompts a runtime draws do not
depend on which Python is installed.
"""

from __future__ import annotations

import ast
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

from .model import EOT

WORKLOADS = ("code", "docs", "changelog")
HELDOUT_BYTES = 24_576
DATA_DIR = Path(__file__).parent / "data"
#: one unit in `_HOLDOUT[w]` is held out
_HOLDOUT = {"code": 64, "docs": 6, "changelog": 4}
#: the sample takes at most this much of each held-out unit, so that it spans many of them
_SAMPLE_UNIT_BYTES = 4096
_SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
_CHANGELOG_FILES = ("idlelib/NEWS.txt", "idlelib/NEWS2x.txt", "idlelib/HISTORY.txt")


@dataclass(frozen=True)
class Split:
    """A workload's training text and its held-out text, each joined into one byte string."""

    train: bytes
    heldout: bytes


def default_stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _code_units(root: Path) -> list[tuple[str, bytes]]:
    units = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_DIRS.isdisjoint(rel.parts) and rel.parts[0] != "pydoc_data":
            units.append((rel.as_posix(), path.read_bytes()))
    return units


def _docs_units(root: Path) -> list[tuple[str, bytes]]:
    tree = ast.parse((root / "pydoc_data" / "topics.py").read_text(encoding="utf-8"))
    topics = next(
        ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
    )
    return [(key, topics[key].encode()) for key in sorted(topics)]


def _changelog_units(root: Path) -> list[tuple[str, bytes]]:
    units = []
    for name in _CHANGELOG_FILES:
        text = (root / name).read_bytes().replace(b"\r\n", b"\n")
        paragraphs = [p for p in text.split(b"\n\n") if p.strip()]
        units += [(f"{name}:{i}", p + b"\n\n") for i, p in enumerate(paragraphs)]
    return units


_READERS = {"code": _code_units, "docs": _docs_units, "changelog": _changelog_units}
#: documents are separated by EOT; a changelog's paragraphs follow one another as in the file
_JOINERS = {"code": bytes([EOT]), "docs": bytes([EOT]), "changelog": b""}


def _held_out(workload: str, key: str) -> bool:
    return zlib.crc32(key.encode()) % _HOLDOUT[workload] == 0


def split(workload: str, stdlib: str | Path | None = None) -> Split:
    """The training text and the held-out text of one workload in the library at `stdlib`."""
    root = Path(stdlib) if stdlib is not None else default_stdlib()
    try:
        units = _READERS[workload](root)
    except (OSError, StopIteration, SyntaxError, ValueError) as exc:
        raise ValueError(f"{root}: cannot read the {workload!r} workload's text ({exc})") from exc
    if not units:
        raise ValueError(f"{root}: no {workload!r} text found (is it a Python standard library?)")
    bad = [key for key, body in units if EOT in body]
    if bad:
        raise ValueError(f"{root}: {bad[0]} holds byte {EOT}, the end-of-text id")
    join = _JOINERS[workload]
    train = join.join(body for key, body in units if not _held_out(workload, key))
    if not train:
        raise ValueError(f"{root}: every {workload!r} unit is held out, none left to train on")
    held = sorted(
        (zlib.crc32(key.encode()), body) for key, body in units if _held_out(workload, key)
    )
    heldout = join.join(body[:_SAMPLE_UNIT_BYTES] for _, body in held)
    return Split(train, heldout[:HELDOUT_BYTES])


def heldout_path(workload: str) -> Path:
    return DATA_DIR / f"heldout-{workload}.bin"


def committed_heldout(workload: str) -> bytes:
    """The held-out sample shipped with the package."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r} (one of {', '.join(WORKLOADS)})")
    return heldout_path(workload).read_bytes()
