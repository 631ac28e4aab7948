"""The reference runtime's `topk` rule held to vLLM 0.33.0's own budget and admission code.

`runtime/scheduler.topk_schedule` is what `AdaptiveVerificationManager.get_num_tokens` (the
budget, on the host, from the previous step's confidences) and `_assign_draft_token_budget`
(the admission, a global top-k of the current survivals) do together. Both of vLLM's
functions run here on CPU, on a manager holding only what `get_num_tokens` reads (the
manager itself needs CUDA streams), with vLLM's cost tables made from the runtime's
additive table (`draft_cost[bs]` = its bias and per-request part, `verify_cost[m]` its
per-token part), every request decoding and every draft scheduled. Needs the `vllm`
package: it runs in the third environment (tools/test.sh); elsewhere it skips.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
av = pytest.importorskip("vllm.v1.worker.gpu.spec_decode.adaptive_verification")

from dspark_obs.domain.cost_table import default_cost_table  # noqa: E402
from dspark_obs.runtime.scheduler import topk_schedule  # noqa: E402

GAMMA = 7


def vllm_windows(stale: np.ndarray, current: np.ndarray, table) -> tuple[int, np.ndarray]:
    bs = len(current)
    ids = {f"r{b}": b for b in range(bs)}
    sizes = np.arange(bs * GAMMA + bs + 2)
    draft_cost = table.bias_seconds + np.interp(sizes, table.bs_probes, table.alpha_seconds)
    verify_cost = np.interp(sizes, table.m_probes, table.theta_seconds)
    manager = SimpleNamespace(
        cost_tables=(draft_cost, verify_cost),
        req_states=SimpleNamespace(
            req_id_to_index=ids, num_computed_tokens_np=np.full(bs, 100, np.int32),
            prefill_len=SimpleNamespace(np=np.full(bs, 10, np.int32)),
        ),
        _stale_confidences=[SimpleNamespace(np=stale)],
        _stale_idx=0, num_speculative_steps=GAMMA, _max_total_logits=1 << 20,
        num_bonus_tokens=1, _batch_budget=None,
    )  # fmt: skip
    tokens = dict.fromkeys(ids, GAMMA + 1)
    drafts = {r: [0] * GAMMA for r in ids}
    av.AdaptiveVerificationManager.get_num_tokens(manager, tokens, drafts)
    budget = manager._batch_budget[2]
    capacities = torch.full((bs,), GAMMA, dtype=torch.int32)
    if budget == 0:
        capacities.zero_()
    elif budget < bs * GAMMA:
        conf = torch.from_numpy(current)
        av._assign_draft_token_budget(conf, torch.arange(bs), capacities, budget, GAMMA)
    return budget, capacities.numpy().astype(np.int64)


@pytest.mark.parametrize("seed", range(12))
def test_topk_schedule_is_vllms_budget_and_admission(seed):
    rng = np.random.default_rng(seed)
    table = default_cost_table()
    bs = int(rng.choice([1, 3, 8, 32, 96, 200]))
    high = rng.uniform(0.3, 1.0)
    stale = rng.uniform(0.0, high, (bs, GAMMA)).astype(np.float32)
    stale[rng.random(bs) < 0.2] = 1.0  # requests new to their slot
    current = rng.uniform(0.0, high, (bs, GAMMA)).astype(np.float32)
    budget, windows = vllm_windows(stale, current, table)
    # vLLM ranks the current survivals as float32 products on the device and plans on
    # float64 products of the stale float32 confidences on the host
    survival = torch.from_numpy(current).cumprod(dim=1).double().numpy()
    plan = topk_schedule(survival, table, np.cumprod(stale.astype(np.float64), axis=1))
    assert plan.budget == budget
    np.testing.assert_array_equal(plan.windows, windows)
