"""`StepBatch` back to SGLang's `dspark_info_record` JSON, as the server would send it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from .batch import STEP_OPTIONAL_FLOAT_FIELDS, StepBatch
from .server_info_wire import COMPONENTS, REQ_INT_FIELDS, DecodeStepRecord, ReqDetail


def batch_to_record(batch: StepBatch, *, step_mode: bool = True) -> DecodeStepRecord:
    """A `StepBatch` as SGLang's step record (the fields SGLang knows, nothing else).

    `step_mode=False` leaves the record's `mode` unset, as SGLang does when the
    `core` component is off.
    """
    reqs = None
    if batch.has_reqs:
        draft = batch.draft_tokens
        if draft is None:
            raise ValueError("SGLang's reqs records need draft_tokens")
        ints = {name: getattr(batch, name).tolist() for name in REQ_INT_FIELDS}
        draft_rows = draft.tolist()
        conf = None if batch.confidence is None else batch.confidence.tolist()
        surv = None if batch.survival is None else batch.survival.tolist()
        rids = batch.rid.tolist()
        reqs = [
            ReqDetail(
                req_pool_index=ints["req_pool_index"][i],
                prefix_len=ints["prefix_len"][i],
                verify_len=ints["verify_len"][i],
                acc_len=ints["acc_len"][i],
                correct_drafts=ints["correct_drafts"][i],
                cap_trim=ints["cap_trim"][i],
                bonus_token=ints["bonus_token"][i],
                draft_tokens=draft_rows[i],
                rid=rids[i],
                confidence=None if conf is None else conf[i],
                survival=None if surv is None else surv[i],
            )
            for i in range(batch.num_reqs)
        ]
    return DecodeStepRecord(
        forward_ct=int(batch.forward_ct),
        bs=int(batch.bs),
        mode=batch.mode if step_mode else "",
        budget=None if batch.budget is None else int(batch.budget),
        lag_steps=None if batch.lag_steps is None else int(batch.lag_steps),
        num_running_reqs=int(batch.num_running_reqs),
        num_verify_tokens=int(batch.num_verify_tokens),
        verify_tokens_local=int(batch.verify_tokens_local),
        verify_tokens_dp_synced=int(batch.verify_tokens_dp_synced),
        verify_tokens_graph_key=int(batch.verify_tokens_graph_key),
        **{name: _float_or_none(getattr(batch, name)) for name in STEP_OPTIONAL_FLOAT_FIELDS},
        reqs=reqs,
    )


def _float_or_none(value: float | None) -> float | None:
    return None if value is None else float(value)


def batches_to_info_record(
    batches: Sequence[StepBatch] | Iterable[StepBatch],
    *,
    mode: str,
    gamma: int,
    components: Sequence[str] = ("core", "reqs"),
    simulate_acc_len: int | None = None,
) -> dict:
    """Steps of one rank as the `dspark_info_record` object `GET /server_info` returns."""
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown record components {sorted(unknown)}; valid: {COMPONENTS}")
    with_core = "core" in components
    records = [batch_to_record(b, step_mode=with_core) for b in batches]
    return {
        "mode": mode,
        "gamma": gamma,
        "verify_num_draft_tokens": gamma + 1,
        "components": sorted(components),
        "simulate_acc_len": simulate_acc_len,
        "records": msgspec.to_builtins(records),
    }
