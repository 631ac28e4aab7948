"""Exact conversion between SGLang's `dspark_info_record` JSON and `StepBatch`.

The public face of three modules, one job each: `server_info_wire` (the wire types,
mirroring SGLang 0.5.23's `DecodeStepRecord` and `ReqDetail` field for field, and the
conversion record by record), `server_info_columnar` (a whole payload in one parse,
with the compiled parser where it is built, msgspec and numpy where not) and
`server_info_encode` (back to the server's JSON, byte for byte). Import from here.
"""

from __future__ import annotations

from .batch import MAX_GAMMA, StepBatch
from .server_info_columnar import _columnar_batches
from .server_info_encode import batch_to_record, batches_to_info_record
from .server_info_wire import (
    COMPONENTS,
    MAX_DP_RANKS,
    REQ_INT_FIELDS,
    DecodeStepRecord,
    InfoRecord,
    ReqDetail,
    SGLangFormatError,
    WorkloadOf,
    _no_workload,
    check_rank_count,
    decode_info_record,
    decode_json,
    decode_step_record,
    record_to_batch,
    server_info_ranks,
)

__all__ = [
    "COMPONENTS",
    "MAX_DP_RANKS",
    "MAX_GAMMA",
    "REQ_INT_FIELDS",
    "DecodeStepRecord",
    "InfoRecord",
    "ReqDetail",
    "SGLangFormatError",
    "WorkloadOf",
    "batch_to_record",
    "batches_to_info_record",
    "check_rank_count",
    "decode_info_record",
    "decode_json",
    "decode_step_record",
    "info_record_to_batches",
    "record_to_batch",
    "server_info_ranks",
]


def info_record_to_batches(
    payload: bytes | str | dict | InfoRecord,
    *,
    rank: int = 0,
    workload_of: WorkloadOf = _no_workload,
) -> list[StepBatch]:
    """Every step record of one rank's `dspark_info_record`, in server order.

    JSON text goes through `_columnar_batches` first: converting record by record
    costs a Python object per number and a loop per request. Whatever that path
    does not take (an error anywhere, or a valid but unusual spelling) is converted
    record by record, so results and errors are the same either way.
    """
    if isinstance(payload, (bytes, str)):
        batches = _columnar_batches(payload, rank, workload_of)
        if batches is not None:
            return batches
    info = payload if isinstance(payload, InfoRecord) else decode_info_record(payload)
    return [
        record_to_batch(rec, gamma=info.gamma, mode=info.mode, rank=rank, workload_of=workload_of)
        for rec in info.records
    ]
