"""The vLLM hook, turned on by installing dspark-obs and one environment variable.

vLLM 0.33.0 loads every `vllm.general_plugins` entry point in each of its processes
(`vllm/plugins/__init__.py`, `load_general_plugins`); dspark-obs declares `register` as one.
With `DSPARK_OBS_VLLM=HOST:PORT` set it arranges that, in a process that imports vLLM's GPU
model runner (`vllm.v1.worker.gpu.model_runner`), the first step each `GPUModelRunner`
samples attaches the hook to that runner (`vllm_worker.attach_runner`): by then its KV cache,
its speculator and its adaptive verification manager exist. Only the runner that reports
for its data-parallel rank (tensor-parallel rank 0, the last pipeline stage: the one that
samples) attaches; its ring joins the node's one consumer serving `/metrics` on HOST:PORT.

Without the variable nothing is done. Where vLLM's interface is not 0.33.0's, or DSpark is
not speculating, it logs one warning and does nothing else; it never raises into vLLM. No
vLLM file is changed: the runner class's `sample` is wrapped when its module is imported.
`DSPARK_OBS_VLLM_MODEL` names the `model_name` label (default: vLLM's served model name),
`DSPARK_OBS_VLLM_RING_SLOTS` the steps a rank's ring holds before it drops (default 16).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys

log = logging.getLogger(__name__)

#: the environment variable that turns the hook on, with the node's `/metrics` address
ENV = "DSPARK_OBS_VLLM"
ENV_MODEL = "DSPARK_OBS_VLLM_MODEL"
#: steps a rank's ring holds before it drops (default 16, as the SGLang hook's)
ENV_SLOTS = "DSPARK_OBS_VLLM_RING_SLOTS"
#: the module and class the hook wraps (vLLM 0.33.0)
RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
RUNNER_CLASS = "GPUModelRunner"
_SEEN = "_dspark_obs_seen"

#: the hooks this process attached, for the tools that look at a running one
attached: list = []


def register() -> None:
    """vLLM's general-plugin entry point: once a process, never raising."""
    listen = os.environ.get(ENV)
    if not listen:
        return
    try:
        from ..listen import parse_listen

        parse_listen(listen)
        ring_slots(os.environ)
        module = sys.modules.get(RUNNER_MODULE)
        if module is not None:
            wrap_runner_class(module, listen)
        elif not any(isinstance(f, _RunnerFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _RunnerFinder(listen))
    except Exception as exc:
        log.warning("dspark-obs: the vLLM hook is off in this process: %s", exc)


class _RunnerFinder(importlib.abc.MetaPathFinder):
    """Wraps the runner class right after its module runs; finds nothing itself."""

    def __init__(self, listen: str) -> None:
        self.listen = listen

    def find_spec(self, name, path, target=None):
        if name != RUNNER_MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module, listen = spec.loader.exec_module, self.listen

        def run(module):
            exec_module(module)
            try:
                wrap_runner_class(module, listen)
            except Exception as exc:
                log.warning("dspark-obs: the vLLM hook is off in this process: %s", exc)

        spec.loader.exec_module = run
        sys.meta_path.remove(self)  # one module, once
        return spec


def wrap_runner_class(module, listen: str) -> None:
    """Make the first `sample` of each runner of `module`'s class attach the hook."""
    from .vllm_worker import knows_interface

    cls = getattr(module, RUNNER_CLASS, None)
    batch = getattr(module, "InputBatch", None)
    output = getattr(sys.modules.get("vllm.v1.worker.gpu.sample.output"), "SamplerOutput", None)
    if cls is None or not knows_interface(cls, batch, output):
        log.warning("dspark-obs: vLLM's GPU model runner is not 0.33.0's; the vLLM hook is off")
        return
    original = cls.sample

    def sample(self, hidden_states, input_batch, grammar_output):
        if _SEEN not in self.__dict__:
            self.__dict__[_SEEN] = True
            _attach(self, listen)
            if "sample" in self.__dict__:  # attached: this step goes through the hook too
                return self.sample(hidden_states, input_batch, grammar_output)
        return original(self, hidden_states, input_batch, grammar_output)

    sample.__wrapped__ = original
    cls.sample = sample


def ring_slots(environ) -> int:
    """The ring's steps from `DSPARK_OBS_VLLM_RING_SLOTS`; ValueError naming a bad value."""
    text = environ.get(ENV_SLOTS) or "16"
    if not text.isdigit() or not 1 <= int(text) <= 1 << 16:
        raise ValueError(f"{ENV_SLOTS} must be a whole number of steps in 1..65536, not {text!r}")
    return int(text)


def _attach(runner, listen: str) -> None:
    import warnings

    from .vllm_worker import attach_runner

    try:
        if not _reports(runner):
            return
        model = os.environ.get(ENV_MODEL) or _served_model_name(runner)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hook = attach_runner(
                runner, rank=int(runner.dp_rank), model_name=model, listen=listen,
                ring_slots=ring_slots(os.environ),
            )  # fmt: skip
        for w in caught[:1]:
            log.warning("%s", w.message)
        if hook is not None:
            attached.append(hook)
            log.info(
                "dspark-obs: vLLM hook on DP rank %d (%s, gamma %d); /metrics of this node on %s",
                hook.ring.rank, hook.ring.mode, hook.gamma, listen,
            )  # fmt: skip
    except Exception as exc:  # never into vLLM
        log.warning("dspark-obs: the vLLM hook is off in this process: %s", exc)


def _reports(runner) -> bool:
    """Whether this runner is the one of its DP rank that samples and reports: the last
    pipeline stage, tensor-parallel rank 0 (every TP rank samples the same tokens)."""
    if not getattr(runner, "is_last_pp_rank", True):
        return False
    try:
        from vllm.distributed.parallel_state import get_tp_group

        return int(get_tp_group().rank_in_group) == 0
    except Exception:
        return True  # no TP group: one rank


def _served_model_name(runner) -> str:
    names = getattr(getattr(runner, "model_config", None), "served_model_name", None)
    if isinstance(names, list | tuple):
        names = names[0] if names else None
    return "" if names is None else str(names)
