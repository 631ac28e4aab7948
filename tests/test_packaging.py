"""The wheel holds every module of the package, not only what an editable install finds.

`pip install .` copies the packages pyproject lists, nothing else, so a new
subpackage left out of that list works in a checkout and fails on a user's
machine with ModuleNotFoundError (the README's demo command installs this way).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _package_roots() -> dict[str, Path]:
    """Each mapped package and its folder; "" maps the folder that holds top-level packages."""
    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]["package-dir"]
    roots = {name: ROOT / path for name, path in mapped.items() if name}
    roots["dspark_obs"] = ROOT / mapped[""] / "dspark_obs"
    return roots


def _package_dirs() -> dict[str, Path]:
    found = {}
    for name, root in _package_roots().items():
        for module in root.rglob("*.py"):
            rel = module.parent.relative_to(root)
            if "__pycache__" not in rel.parts:
                found[".".join((name, *rel.parts))] = module.parent
    return found


def test_every_package_directory_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    found = set(_package_dirs())
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but missing: {sorted(listed - found)}"


def test_every_package_directory_is_a_regular_package():
    """A folder without `__init__.py` imports as a namespace package in a checkout and may be
    left out of a wheel; every one of ours says what it holds in its `__init__`."""
    dirs = _package_dirs()
    assert [name for name, path in dirs.items() if not (path / "__init__.py").exists()] == []


def test_the_checkout_holds_no_importable_copy_of_the_package():
    """Tests run against the installed package: a `dspark_obs/` folder at the top of the
    checkout would shadow it (and its compiled parts) for `python -m pytest`."""
    assert not (ROOT / "dspark_obs").exists()
