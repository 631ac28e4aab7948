"""SGLang 0.5.23's own DSpark observer types, loaded and fed on a CPU.

For tests/test_sglang_real_types.py and bench/sglang_paths.py, which need the `sglang`
package (tools/test.sh installs it in a second environment; elsewhere they skip).
Two things around SGLang's types are not its real parts, because neither can exist on
a CPU: the planner the observers are built with (SGLang's needs a draft model; the
observers read five attributes of it), and `sampling_info` (a namespace with the fields
the observers read). torchvision, which SGLang imports for multimodal configs and whose
only wheel is a CUDA build, is replaced by an empty module before SGLang loads.
"""

from __future__ import annotations

import enum
import importlib.machinery
import sys
import types
from types import SimpleNamespace

import torch


def _without_torchvision() -> None:
    """SGLang's config package imports torchvision at module level (for multimodal models
    never built here); an empty stand-in lets it load against a CPU torch."""
    import transformers.utils as tu
    import transformers.utils.import_utils as iu

    iu.is_torchvision_available = tu.is_torchvision_available = lambda: False
    if "torchvision" in sys.modules:
        return

    class InterpolationMode(enum.Enum):
        NEAREST, NEAREST_EXACT, BILINEAR = "nearest", "nearest-exact", "bilinear"
        BICUBIC, BOX, HAMMING, LANCZOS = "bicubic", "box", "hamming", "lanczos"

    names = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")
    mods = [types.ModuleType(n) for n in names]
    for m in mods:
        m.__spec__ = importlib.machinery.ModuleSpec(m.__name__, None, is_package=True)
        m.__path__ = []
        m.InterpolationMode = InterpolationMode
        sys.modules[m.__name__] = m
    mods[0].transforms, mods[1].functional = mods[1], mods[2]


_without_torchvision()

from sglang.srt.runtime_context import get_parallel  # noqa: E402
from sglang.srt.speculative.dspark_components.dspark_draft import DraftBlockResult  # noqa: E402
from sglang.srt.speculative.dspark_components.dspark_observability import (  # noqa: E402
    DsparkStepObservers,
)
from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout  # noqa: E402

__all__ = ["DraftBlockResult", "DsparkStepObservers", "as_sglang", "observers"]


class Planner:
    """What DsparkStepObservers reads of SGLang's verify planner (which needs a model)."""

    mode_value = "compact"
    carries_confidence = True
    is_compact_mode = True
    lag_steps = None

    def take_budget_decision(self):
        return None


def observers(gamma: int, device: str = "cpu") -> DsparkStepObservers:
    """SGLang's observers, with the collection paths the environment switches on
    (`SGLANG_DSPARK_DEBUG_DUMP`: the `/server_info` dumper;
    `SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH`: the block-accept JSONL recorder)."""
    with get_parallel().override(attn_tp_rank=0):
        return DsparkStepObservers(
            planner=Planner(),
            gamma=gamma,
            verify_num_draft_tokens=gamma + 1,
            tp_rank=0,
            device=torch.device(device),
            simulate_acc_len=-1.0,
        )


def as_sglang(kw: dict) -> dict:
    """An observer call (tests/hook_reference.py, bench/hook_step.py) with SGLang's real
    draft block and verify layout, and the sampling fields its observers read."""
    block = kw["draft_block"]
    verify_lens = kw["layout"].verify_lens
    temps = kw["sampling_info"].temperatures
    bs = kw["bs"]
    return dict(
        kw,
        layout=RaggedVerifyLayout.from_verify_lens_device(
            verify_lens=verify_lens, graph_num_tokens=-(-int(verify_lens.sum()) // 8) * 8
        ),
        draft_block=DraftBlockResult(
            draft_tokens=block.draft_tokens,
            corrected_logits=block.corrected_logits,
            greedy_mask=block.greedy_mask,
            temperatures=block.temperatures,
            greedy_draft=block.greedy_draft,
        ),
        sampling_info=SimpleNamespace(
            temperatures=temps,
            top_ks=torch.full((bs,), 1 << 30, device=temps.device),
            top_ps=torch.ones(bs, device=temps.device),
            min_ps=torch.zeros(bs, device=temps.device),
            has_custom_logit_processor=False,
            penalizer_orchestrator=None,
            grammar_mask=None,
            logit_bias=None,
        ),
    )
