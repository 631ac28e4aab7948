"""SGLang's `dspark_info_record` wire types, and their conversion to `StepBatch` record by record.

The wire types mirror SGLang 0.5.23's `DecodeStepRecord` and `ReqDetail`
(msgspec structs with `omit_defaults`), field for field and in the same order,
so that decoding validates types the way the server encodes them and encoding
a batch back (`server_info_encode`) reproduces the server's JSON byte for byte.
The per-record conversion is the reference every faster path must agree with
(`server_info_columnar`); `server_info` is the public face of all three.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import msgspec
import numpy as np

from .batch import (
    MAX_GAMMA,
    MODES,
    STEP_INT_FIELDS,
    STEP_OPTIONAL_FLOAT_FIELDS,
    STEP_OPTIONAL_INT_FIELDS,
    InvalidBatch,
    StepBatch,
    empty_request_columns,
    step_scalar_fields,
)

#: Record components SGLang can dump (`SGLANG_DSPARK_DEBUG_DUMP`).
COMPONENTS = (
    "core",
    "step_cpu_time",
    "step_gpu_time",
    "draft_gpu_time",
    "target_verify_gpu_time",
    "reqs",
)


class ReqDetail(msgspec.Struct, omit_defaults=True):
    req_pool_index: int
    prefix_len: int
    verify_len: int
    acc_len: int
    correct_drafts: int
    cap_trim: int
    bonus_token: int
    draft_tokens: list[int]
    rid: str | None = None
    confidence: list[float] | None = None
    survival: list[float] | None = None


#: SGLang's step record fields after `forward_ct`, in its order (`mode` follows `bs` there).
_STEP_SCALARS = (
    "bs",
    "mode",
    *STEP_OPTIONAL_INT_FIELDS,
    *STEP_INT_FIELDS[1:],
    *STEP_OPTIONAL_FLOAT_FIELDS,
)

#: The step scalars a record hands to `StepBatch` as they are (all but `mode`).
_RECORD_SCALARS = (*STEP_INT_FIELDS, *STEP_OPTIONAL_INT_FIELDS, *STEP_OPTIONAL_FLOAT_FIELDS)

DecodeStepRecord = msgspec.defstruct(
    "DecodeStepRecord",
    [
        ("forward_ct", int),
        *step_scalar_fields(_STEP_SCALARS),
        ("reqs", list[ReqDetail] | None, None),
    ],
    omit_defaults=True,
    module=__name__,
)


class InfoRecord(msgspec.Struct):
    """The `dspark_info_record` object of one DP rank."""

    mode: str
    gamma: int
    verify_num_draft_tokens: int
    components: list[str]
    records: list[DecodeStepRecord]
    simulate_acc_len: int | None = None


#: Most data-parallel ranks one server's answer may list (see `check_rank_count`).
MAX_DP_RANKS = 256

#: `ReqDetail`'s integer fields, in SGLang's order.
REQ_INT_FIELDS = (
    "req_pool_index",
    "prefix_len",
    "verify_len",
    "acc_len",
    "correct_drafts",
    "cap_trim",
    "bonus_token",
)


class SGLangFormatError(InvalidBatch):
    """A payload that does not follow SGLang's documented record shape.

    An `InvalidBatch`, so it carries the `reason` label a source counts it under
    (`dspark_ingest_errors_total{reason=...}`): `bad_record` for a record that
    does not decode or convert, `bad_json` for undecodable bytes, or the
    telemetry model's own reason (`window_out_of_range`, ...) for a record
    that decodes but breaks DSpark's invariants.
    """

    def __init__(self, message: str, reason: str = "bad_record") -> None:
        super().__init__(reason, message)


WorkloadOf = Callable[[np.ndarray], np.ndarray]


def _no_workload(rids: np.ndarray) -> np.ndarray:
    return np.full(len(rids), "other", dtype=object)


def _sorted_codes(values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct names of a column as text, sorted, and each row's index among them.

    What `np.unique(..., return_inverse=True)` gives, through a dictionary: a column
    holds a few names among thousands of rows, and sorting every row is the slow part.
    """
    keys = list(map(str, values.tolist()))
    names = sorted(set(keys))
    index = {name: i for i, name in enumerate(names)}
    return names, np.fromiter(map(index.__getitem__, keys), np.int64, len(keys))


def _categories(workload: np.ndarray) -> dict[str, object]:
    """A step's workload column in categorical form (`StepBatch.workload_codes` into
    `workload_names`, its distinct names sorted), so that the aggregates group its rows
    with a table lookup instead of sorting strings at every step."""
    names, codes = _sorted_codes(workload)
    return {"workload_codes": codes, "workload_names": tuple(names)}


def decode_json(payload: bytes | bytearray | str, type_: object = object) -> object:
    """msgspec's JSON decode, with nesting too deep for it refused by name.

    msgspec follows nesting by recursion and gives up at the interpreter's recursion
    limit (about a thousand levels, far beyond anything SGLang writes) with a
    RecursionError; that becomes a `too_deep` format error, so no caller shows a
    traceback for it. Decode and validation errors pass through as msgspec's.
    """
    try:
        return msgspec.json.decode(payload, type=type_)
    except RecursionError:
        raise SGLangFormatError(
            f"JSON nested deeper than {sys.getrecursionlimit():,} levels", "too_deep"
        ) from None


def decode_info_record(payload: bytes | str | dict) -> InfoRecord:
    """Parse one rank's `dspark_info_record` (JSON text or an already-decoded dict)."""
    if not isinstance(payload, (bytes, str, dict)):
        # e.g. a rank whose dspark_info_record is null or a list in a damaged answer
        raise SGLangFormatError(f"not a dspark_info_record: a {type(payload).__name__}")
    try:
        if isinstance(payload, dict):
            return msgspec.convert(payload, InfoRecord)
        return decode_json(payload, InfoRecord)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise SGLangFormatError(f"not a dspark_info_record: {exc}") from exc


def decode_step_record(raw: object) -> DecodeStepRecord:
    """One step record from its decoded JSON, or SGLangFormatError (`bad_record`).

    Sources decode an envelope's records one by one with this, so a record of
    the wrong shape costs that record only.
    """
    try:
        return msgspec.convert(raw, DecodeStepRecord)
    except (msgspec.ValidationError, TypeError) as exc:
        raise SGLangFormatError(f"not a step record: {exc}") from exc


def record_to_batch(
    rec: DecodeStepRecord,
    *,
    gamma: int,
    mode: str,
    rank: int = 0,
    workload_of: WorkloadOf = _no_workload,
) -> StepBatch:
    """One SGLang step record as a `StepBatch`.

    `mode` is the envelope's mode; a record's own `mode` wins where present.
    SGLang dumps carry no sampling parameters, so `greedy` is -1 and
    `temperature` NaN; no log-probabilities either.
    """
    step_mode = rec.mode or mode
    if step_mode not in MODES:
        raise SGLangFormatError(f"forward_ct {rec.forward_ct}: unknown mode {step_mode!r}")
    if not 1 <= gamma <= MAX_GAMMA:
        # before anything is sized by it: a corrupt gamma must not allocate [bs, gamma]
        raise SGLangFormatError(
            f"forward_ct {rec.forward_ct}: gamma {gamma} outside 1..{MAX_GAMMA}",
            "gamma_out_of_range",
        )
    scalars = {name: getattr(rec, name) for name in _RECORD_SCALARS}
    reqs = rec.reqs
    if reqs is None:
        # validated too: its step scalars reach the aggregates like any other step's
        return _validated(
            rec,
            StepBatch(
                forward_ct=rec.forward_ct,
                gamma=gamma,
                mode=step_mode,
                rank=rank,
                has_reqs=False,
                **scalars,
            ),
        )
    n = len(reqs)
    cols = empty_request_columns(n, gamma)
    try:
        for name in REQ_INT_FIELDS:
            cols[name] = np.fromiter((getattr(r, name) for r in reqs), dtype=np.int64, count=n)
    except OverflowError as exc:  # JSON integers are unbounded; int64 columns are not
        raise SGLangFormatError(f"forward_ct {rec.forward_ct}: {name} beyond int64") from exc
    cols["rid"] = np.array([r.rid for r in reqs] + [None], dtype=object)[:n]
    if n and all(r.rid is not None for r in reqs):
        cols["workload"] = workload_of(cols["rid"])
    else:
        cols["workload"] = np.full(n, "other", dtype=object)
    matrices: dict[str, np.ndarray | None] = {}
    try:
        matrices["draft_tokens"] = np.array([r.draft_tokens for r in reqs], dtype=np.int64).reshape(
            n, gamma
        )
        for name in ("confidence", "survival"):
            present = [getattr(r, name) is not None for r in reqs]
            if n and all(present):
                matrices[name] = np.array(
                    [getattr(r, name) for r in reqs], dtype=np.float64
                ).reshape(n, gamma)
            elif any(present):
                raise SGLangFormatError(f"forward_ct {rec.forward_ct}: {name} on some reqs only")
            else:
                matrices[name] = None
    except SGLangFormatError:
        raise
    except ValueError as exc:
        raise SGLangFormatError(
            f"forward_ct {rec.forward_ct}: per-position lists are not {gamma} long"
        ) from exc
    except OverflowError as exc:
        raise SGLangFormatError(f"forward_ct {rec.forward_ct}: draft token beyond int64") from exc
    batch = StepBatch(
        forward_ct=rec.forward_ct,
        gamma=gamma,
        mode=step_mode,
        rank=rank,
        **scalars,
        **cols,
        **_categories(cols["workload"]),
        **matrices,
    )
    return _validated(rec, batch)


def _validated(rec: DecodeStepRecord, batch: StepBatch) -> StepBatch:
    try:
        batch.validate()
    except InvalidBatch as exc:
        raise SGLangFormatError(f"forward_ct {rec.forward_ct}: {exc}", exc.reason) from exc
    return batch


def check_rank_count(states: list) -> None:
    """Refuse an answer listing more DP ranks than any deployment has.

    Each rank becomes a `rank` label value and its own aggregate groups, so a
    damaged answer with thousands of entries would blow up both the series
    count and the cost of every update.
    """
    if len(states) > MAX_DP_RANKS:
        raise SGLangFormatError(
            f"server_info lists {len(states)} ranks, more than {MAX_DP_RANKS}", "too_many_ranks"
        )


def server_info_ranks(payload: bytes | bytearray | str | dict) -> list[dict | None]:
    """Each DP rank's `dspark_info_record` in a `GET /server_info` answer (None if absent)."""
    try:
        data = decode_json(payload) if isinstance(payload, (bytes, bytearray, str)) else payload
    except msgspec.DecodeError as exc:
        raise SGLangFormatError(f"server_info is not JSON: {exc}", "bad_json") from exc
    states = data.get("internal_states") if isinstance(data, dict) else None
    if not isinstance(states, list):
        raise SGLangFormatError("server_info has no internal_states list", "bad_json")
    check_rank_count(states)
    return [s.get("dspark_info_record") if isinstance(s, dict) else None for s in states]
