"""The wheel holds every module of the package, not only what an editable install finds.

`pip install .` copies the packages pyproject lists, nothing else, so a new
subpackage left out of that list works in a checkout and fails on a user's
machine with ModuleNotFoundError (the README's demo command installs this way).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = config["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    mapped = setuptools.get("package-dir", {})
    found = set()
    roots = {"dspark_obs": ROOT / "dspark_obs"}
    roots.update({name: ROOT / path for name, path in mapped.items()})
    for name, root in roots.items():
        for init in root.rglob("*.py"):
            rel = init.parent.relative_to(root)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join((name, *rel.parts)))
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
