"""`load_json_file`: one clear line naming the file and what it was, whatever went wrong."""

from __future__ import annotations

import re

import msgspec
import pytest

from dspark_obs.calibration.sts import load_sts
from dspark_obs.domain.cost_table import load_cost_table
from dspark_obs.json_files import load_json_file


class Thing(msgspec.Struct, frozen=True):
    size: int

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError("size must be >= 0")


@pytest.mark.parametrize(
    "content, reason",
    [
        (None, "no such file"),
        ("directory", ""),
        ("{not json", "JSON"),
        ('{"size": "1"}', "Expected `int`"),
        ('{"size": -1}', "size must be >= 0"),
        ("{}", "missing required field"),
    ],
)
def test_every_problem_is_one_line_naming_the_file_and_what_it_was(tmp_path, content, reason):
    path = tmp_path / "thing.json"
    if content == "directory":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ValueError) as info:
        load_json_file(path, Thing, "the thing")
    message = str(info.value)
    assert message.startswith(f"the thing {path}: ") and reason in message
    assert "\n" not in message


def test_a_good_file_loads(tmp_path):
    path = tmp_path / "thing.json"
    path.write_text('{"size": 3}')
    assert load_json_file(str(path), Thing, "the thing") == Thing(3)


@pytest.mark.parametrize(
    "load, what", [(load_sts, "STS calibration"), (load_cost_table, "cost table")]
)
def test_the_loaders_say_what_they_load(tmp_path, load, what):
    path = tmp_path / "bad.json"
    path.write_text("[]")
    with pytest.raises(ValueError, match=re.escape(f"{what} {path}: ")):
        load(path)
    with pytest.raises(ValueError, match=re.escape(f"{what} {tmp_path / 'nope.json'}: no such")):
        load(tmp_path / "nope.json")
