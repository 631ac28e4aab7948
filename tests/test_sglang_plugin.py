"""The `--forward-hooks` factory where it must do nothing, and what it costs a serving process.

Where it attaches, it is tested on SGLang's own `register_forward_hooks` and
`DsparkStepObservers` (tests/test_node_consumer.py, in the SGLang environment). Here are the
cases a real launch reaches only with another SGLang: no DSpark observers at all (this
environment has no sglang), observers whose interface is not 0.5.23's, DSpark switched
off, a TP rank that does not report, and a bad config. Each runs the factory in a fresh
interpreter, as a scheduler process does, with the `sglang` modules it looks for made up in
that process (a module of SGLang's own names holding a class of another signature: what a
different SGLang would offer). Every case asserts the one line it logs and that no ring, no
consumer and no hook came of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_obs.hooks.sglang_plugin import FACTORY, NO_MODULE, SPEC_NAME, settings, spec

ROOT = Path(__file__).resolve().parent.parent

#: a scheduler process's factory call, with made-up sglang modules set up by `SETUP`
_PROBE = """
import json, logging, sys, types
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
{setup}
from dspark_obs.hooks import sglang_plugin
config = json.loads(sys.argv[1])
print("returned", sglang_plugin.install(config), sglang_plugin.install(config))
print("attached", sglang_plugin.attached)
"""

_MODULES = """
def module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m
for name in ("sglang", "sglang.srt", "sglang.srt.speculative",
             "sglang.srt.speculative.dspark_components"):
    module(name, __path__=[])
from dspark_obs.hooks.sglang_worker import OBSERVER_PARAMETERS
import inspect
class DsparkStepObservers:
    def __init__(self): pass
    def observe_verify_step(self, *, forward_ct, reqs, bs): pass
if {same_interface}:
    DsparkStepObservers.observe_verify_step.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in OBSERVER_PARAMETERS])
    DsparkStepObservers()  # built before the factory runs, as 0.5.23 builds it
module("sglang.srt.speculative.dspark_components.dspark_observability",
       DsparkStepObservers=DsparkStepObservers)
class Bag:
    def __init__(self, **kw): self.__dict__.update(kw)
module("sglang.srt.runtime_context",
       get_spec=lambda: Bag(speculative_algorithm={algorithm!r}),
       get_parallel=lambda: Bag(attn_tp_rank={attn_tp_rank}, attn_cp_rank=0, dp_rank=0,
                                attn_dp_size=1, attn_dp_rank=0))
"""


def run_factory(config: dict, setup: str = "") -> tuple[str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(setup=setup), json.dumps(config)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return proc.stdout, proc.stderr


def hook_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("dspark_obs")]


def test_the_printed_spec_is_what_sglang_reads():
    """`sglang-flag` as a subprocess: the list SGLang's --forward-hooks parses, whose
    factory is importable and whose module pattern matches no module name."""
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_obs", "sglang-flag", "--json", "--listen", "0.0.0.0:9500",
         "--model", "org/model-7b"], capture_output=True, text=True, check=True,
    )  # fmt: skip
    (entry,) = json.loads(proc.stdout)
    assert entry == {
        "name": SPEC_NAME,
        "target_modules": [NO_MODULE],
        "hook_factory": FACTORY,
        "config": {"listen": "0.0.0.0:9500", "model_name": "org/model-7b"},
    }
    assert entry == spec(entry["config"])[0]
    quoted = subprocess.run(
        [sys.executable, "-m", "dspark_obs", "sglang-flag"], capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    assert quoted.startswith("'[") and json.loads(quoted[1:-1])[0]["config"] == {
        "listen": "127.0.0.1:9464"
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--listen", "nowhere"], "expected HOST:PORT"),
        (["--ring-slots", "0"], "ring_slots must be a positive integer"),
        (["--model", "a\x1bb"], "--model must be printable text"),
        (["--model", "m" * 201], "--model must be 1 to 200 bytes"),
    ],
)
def test_bad_flag_values_are_one_line_and_exit_2(argv, message):
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_obs", "sglang-flag", *argv], capture_output=True,
        text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_config_keys_and_values_are_checked():
    assert settings({"listen": "h:1"})["ring_slots"] == 16
    with pytest.raises(ValueError, match="unknown config keys \\['listn'\\]"):
        settings({"listn": "h:1"})
    with pytest.raises(ValueError, match="pool_slots must be a positive integer"):
        settings({"pool_slots": True})


def test_without_dspark_observers_it_logs_one_line_and_does_nothing():
    """This environment's Python has no sglang: as an SGLang without DSpark's observers."""
    out, err = run_factory({"listen": "127.0.0.1:9"})
    assert "returned None None" in out and "attached None" in out
    (line,) = hook_lines(err)
    assert "this SGLang has no DSpark step observers" in line and "hook off" in line


@pytest.mark.parametrize(
    "algorithm, attn_tp_rank, same_interface, expected",
    [
        ("EAGLE", 0, True, "DSpark is off (speculative algorithm EAGLE); hook off"),
        ("DSPARK", 0, False, "observe_verify_step is not 0.5.23's; hook off"),
        ("DSPARK", 1, True, None),
    ],
    ids=["dspark-off", "another-interface", "a-tp-rank-that-does-not-report"],
)
def test_where_it_must_not_attach_it_logs_at_most_one_line(
    algorithm, attn_tp_rank, same_interface, expected
):
    setup = _MODULES.format(
        algorithm=algorithm, attn_tp_rank=attn_tp_rank, same_interface=same_interface
    )
    out, err = run_factory({}, setup)
    assert "returned None None" in out and "attached None" in out
    if expected is None:
        assert not hook_lines(err), err
    else:
        (line,) = hook_lines(err)
        assert expected in line


def test_a_bad_config_never_raises_into_sglang():
    out, err = run_factory({"listen": "no-port"})
    assert "returned None None" in out and "attached None" in out
    (line,) = hook_lines(err)
    assert "the hook is off in this process" in line and "expected HOST:PORT" in line


def test_the_serving_process_imports_only_the_hooks_serving_side():
    """What the factory brings into a scheduler process: the hook's serving side, no
    pipeline, polars, matplotlib, estimator or exporter (bench/hook_import.py times it)."""
    probe = (
        "import sys, torch, numpy\n"
        "before = set(sys.modules)\n"
        "import dspark_obs.hooks.sglang_plugin, dspark_obs.hooks.sglang_worker\n"
        "print('\\n'.join(sorted(set(sys.modules) - before)))\n"
    )
    added = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert added and all(m.startswith("dspark_obs") for m in added), added
    ours = {m.removeprefix("dspark_obs.") for m in added}
    assert ours <= {
        "dspark_obs", "hooks", "listen", "hooks.sglang_plugin", "hooks.sglang_worker",
        "hooks.rendezvous", "hooks.shared_ring", "hooks.observed_step", "hooks.step_layout",
        "hooks.submit", "hooks.pack_torch",
    }, ours  # fmt: skip
