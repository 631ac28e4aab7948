"""The runtime's keyed normal tables: the compiled form (`runtime/_hashing.c`) and numpy's
give the same bits, and the runtime's streams do not depend on which one ran.

The runtime's determinism rests on every draw being a pure function of its keys, so the
compiled table must be that function exactly, not approximately: compact and cap-accept
commit identical streams only while every draw along them is the same bits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dspark_obs import extensions
from dspark_obs.runtime import hashing
from dspark_obs.runtime.hashing import mix, normal, normal_table

compiled = hashing._compiled
needs_compiled = pytest.mark.skipif(compiled is None, reason="runtime._hashing is not built")


def numpy_table(keys: np.ndarray, width: int, tag: int) -> np.ndarray:
    """What `normal_table` computes, written with the numpy chain."""
    return normal(
        np.asarray(keys, dtype=np.uint64)[:, None], np.arange(width, dtype=np.uint64), tag
    )


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint64)


KEYS = {
    "hashed": mix(np.arange(300), 7),
    "extremes": np.array([0, 1, 2**63, 2**64 - 1, 0x9E3779B97F4A7C15], dtype=np.uint64),
    "one": np.array([12345], dtype=np.uint64),
    "none": np.zeros(0, dtype=np.uint64),
}


@needs_compiled
@pytest.mark.parametrize("name", sorted(KEYS))
@pytest.mark.parametrize("width", [0, 1, 7, 128, 257])
@pytest.mark.parametrize("tag", [0, 11, 21, 2**64 - 1])
def test_compiled_table_is_numpys_bit_for_bit(name, width, tag):
    keys = KEYS[name]
    got = compiled.normal_table(keys, width, tag)
    want = numpy_table(keys, width, tag)
    assert got.dtype == np.float64 and got.shape == (len(keys), width)
    np.testing.assert_array_equal(bits(got), bits(want))


@needs_compiled
def test_the_table_is_approximately_standard_normal():
    """Irwin-Hall of four 16-bit uniforms, scaled: mean 0, variance 1, within 6 sigmas."""
    x = compiled.normal_table(mix(np.arange(4096), 3), 256, 5).ravel()
    assert abs(x.mean()) < 0.01 and abs(x.var() - 1) < 0.01
    assert np.abs(x).max() <= 2 * np.sqrt(3) + 1e-12


def test_normal_table_takes_any_integer_keys_as_the_chain_does():
    """Signed, strided or listed keys are cast as every other draw casts its keys."""
    signed = np.array([-1, 0, 5, -(2**40)], dtype=np.int64)
    strided = mix(np.arange(40), 9)[::3]
    for keys in (signed, strided, [3, 4, 5]):
        got = normal_table(keys, 9, 13)
        want = normal(
            np.asarray(keys).astype(np.uint64)[:, None], np.arange(9, dtype=np.uint64), 13
        )
        np.testing.assert_array_equal(bits(got), bits(want))


@needs_compiled
@pytest.mark.parametrize(
    "keys, width, tag, error",
    [
        (np.arange(4, dtype=np.int64), 3, 1, ValueError),
        (np.zeros((2, 2), dtype=np.uint64), 3, 1, ValueError),
        (np.arange(8, dtype=np.uint64)[::2], 3, 1, ValueError),
        ([1, 2], 3, 1, ValueError),
        (np.arange(4, dtype=np.uint64), -1, 1, ValueError),
        (np.arange(4, dtype=np.uint64), 3, -1, OverflowError),
        (np.arange(4, dtype=np.uint64), 3, 2**64, OverflowError),
    ],
)
def test_the_kernel_refuses_what_it_cannot_read(keys, width, tag, error):
    with pytest.raises(error):
        compiled.normal_table(keys, width, tag)


_STREAM = """
import hashlib, json
import numpy as np
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
out = {}
for world in ("reference", "adversarial-confidence"):
    rt = DSparkRuntime(RuntimeConfig(seed=5, world=world, concurrency=[1, 24], steps_per_level=30,
                                     max_new_tokens=24))
    h = hashlib.sha256()
    for b in rt.run():
        for col in (b.draft_tokens, b.confidence_logits, b.draft_logprobs, b.acc_len, b.verify_len):
            h.update(np.ascontiguousarray(col).tobytes())
        h.update("\\n".join(b.rid.tolist()).encode())
    out[world] = h.hexdigest()
print(json.dumps(out))
"""


def stream(disabled: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != extensions.DISABLE}
    if disabled:
        env[extensions.DISABLE] = "1"
    done = subprocess.run(
        [sys.executable, "-c", _STREAM], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


@needs_compiled
def test_the_runtime_streams_are_the_same_with_the_extensions_off():
    """Two worlds' steps (drafts, confidence, accept lengths, windows, rids) hashed whole,
    in a process with the compiled table and in one with every extension off."""
    assert stream(disabled=False) == stream(disabled=True)
