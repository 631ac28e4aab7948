"""A `/server_info` answer cut into ranks and records as JSON text, and converted a chunk
at a time.

An answer can hold a million step records. Decoded whole into Python objects, or
converted into one StepBatch per record at once, it took more than twenty times its
size in memory. Here the answer is parsed once into slices of its own text (msgspec's
`Raw`: no copy), each record's `forward_ct` is read to order and de-duplicate them,
and only then are records converted, a chunk at a time (`convert_records`): the
answer is held once, and its steps exist as StepBatches a chunk at a time. The live
poller and `ingest` both read answers through this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import msgspec
import numpy as np
from msgspec import Raw

from .batch import MAX_FORWARD_CT, MAX_GAMMA, InvalidBatch, StepBatch
from .server_info_columnar import _columnar_batches
from .server_info_wire import (
    SGLangFormatError,
    WorkloadOf,
    _no_workload,
    decode_info_record,
    decode_json,
    decode_step_record,
    record_to_batch,
)

#: Records converted at once, and their most text (one record may exceed it alone): steps
#: exist as StepBatches a chunk at a time, so memory follows the size of an answer, not
#: the number of steps in it, and a chunk's copy of its text stays small beside the answer.
CHUNK_RECORDS = 2048
CHUNK_BYTES = 8 << 20
NULL = Raw(b"null")
#: The envelope fields of a `dspark_info_record`, as `InfoRecord` declares them.
ENVELOPE_FIELDS = ("mode", "gamma", "verify_num_draft_tokens", "components", "simulate_acc_len")


class _ServerInfo(msgspec.Struct):
    internal_states: list[Raw]


class _RankState(msgspec.Struct):
    dspark_info_record: Raw = NULL


class _Envelope(msgspec.Struct):
    """A `dspark_info_record` with each record as its JSON text; the envelope's fields as
    sent, to be checked by `decode_info_record`."""

    records: list[Raw]
    mode: Any = None
    gamma: Any = None
    verify_num_draft_tokens: Any = None
    components: Any = None
    simulate_acc_len: Any = None


class Key(msgspec.Struct, gc=False):
    """A record's `forward_ct` alone, whatever its type (`valid_step_number` judges it)."""

    forward_ct: Any = None


class _Keys(msgspec.Struct, gc=False):
    records: list[Key]


def split_ranks(payload: bytes | bytearray | str) -> list[Raw]:
    """Each rank's state in a `GET /server_info` answer, as JSON text.

    Raises msgspec.DecodeError for text that is not JSON, SGLangFormatError for JSON
    without an `internal_states` list (`bad_json`) or nested too deep (`too_deep`).
    """
    try:
        return decode_json(payload, _ServerInfo).internal_states
    except msgspec.ValidationError:
        raise SGLangFormatError("server_info has no internal_states list", "bad_json") from None


def rank_record(state: Raw) -> Raw | None:
    """A rank's `dspark_info_record` as JSON text; None where the rank has none."""
    try:
        record = decode_json(state, _RankState).dspark_info_record
    except msgspec.ValidationError:  # a state that is not an object has no record
        return None
    return None if record == NULL else record


def split_records(record: Raw | bytes) -> tuple[dict, list[Raw]]:
    """A `dspark_info_record`'s envelope fields (checked) and its records as JSON text.

    Raises SGLangFormatError naming what is wrong with the envelope: `bad_envelope`, or
    `gamma_out_of_range` for a gamma no DSpark server runs.
    """
    try:
        envelope = decode_json(record, _Envelope)
    except msgspec.MsgspecError as exc:
        raise SGLangFormatError(f"not a dspark_info_record: {exc}", "bad_envelope") from None
    fields = {
        name: value
        for name in ENVELOPE_FIELDS
        if (value := getattr(envelope, name)) is not None or name == "simulate_acc_len"
    }
    try:
        info = decode_info_record(msgspec.json.encode({**fields, "records": []}))
    except SGLangFormatError as exc:
        raise SGLangFormatError(str(exc), "bad_envelope") from None
    check_gamma(info.gamma)
    return fields, envelope.records


def answer_records(payload: bytes | bytearray | str) -> list[Raw | None]:
    """Each rank's `dspark_info_record` in a `GET /server_info` answer, as JSON text (None
    for a rank without one), in rank order. Raises as `split_ranks`."""
    return [rank_record(state) for state in split_ranks(payload)]


class RankRecords(NamedTuple):
    """One rank's `dspark_info_record`: its envelope fields (checked), its records as JSON
    text, and each record's `forward_ct` (-1 where it is not a valid step counter)."""

    fields: dict
    records: list[Raw]
    forward_cts: np.ndarray


def rank_records(record: Raw | bytes) -> RankRecords:
    """A rank's record cut into what the file reader and the live poller both need to
    order, de-duplicate and convert its steps. Raises as `split_records`."""
    fields, records = split_records(record)
    return RankRecords(fields, records, step_numbers(record, records))


def check_gamma(gamma: int) -> None:
    """SGLangFormatError (`gamma_out_of_range`) for a gamma nothing can be sized by."""
    if not 1 <= gamma <= MAX_GAMMA:
        raise SGLangFormatError(f"gamma {gamma} outside 1..{MAX_GAMMA}", "gamma_out_of_range")


def step_numbers(record: Raw | bytes, records: list[Raw]) -> np.ndarray:
    """Each record's `forward_ct`, -1 where it is not a valid step counter (0..2**53; its
    conversion then refuses the record with the reason)."""
    try:
        keys = decode_json(record, _Keys).records
    except msgspec.ValidationError:  # a record that is not an object: one at a time
        keys = [_key(raw) for raw in records]
    return np.fromiter(map(valid_step_number, keys), dtype=np.int64, count=len(keys))


def valid_step_number(key: Key) -> int:
    """The record's forward_ct where it is a valid step counter (0..2**53), else -1."""
    fct = key.forward_ct
    return fct if type(fct) is int and 0 <= fct <= MAX_FORWARD_CT else -1


def _key(raw: Raw) -> Key:
    try:
        return decode_json(raw, Key)
    except msgspec.MsgspecError:
        return Key()


def chunks(records: list, order: np.ndarray) -> Iterator[np.ndarray]:
    """`order` (indexes into `records`) cut into consecutive chunks of at most
    CHUNK_RECORDS records and CHUNK_BYTES of text, each at least one record."""
    sizes = np.fromiter(
        (len(records[i]) if isinstance(records[i], (bytes, Raw)) else 0 for i in order.tolist()),
        dtype=np.int64,
        count=len(order),
    )
    ends = np.cumsum(sizes)
    start = 0
    while start < len(order):
        base = ends[start - 1] if start else 0
        by_bytes = int(np.searchsorted(ends, base + CHUNK_BYTES, side="right"))
        stop = min(start + CHUNK_RECORDS, max(by_bytes, start + 1))
        yield order[start:stop]
        start = stop


def _decode_record(raw: object) -> object:
    """One record's JSON text decoded (a record given decoded passes through); its text is a
    slice of a document already parsed, so what fails here is a string that is not UTF-8
    (msgspec checks those only when decoding them)."""
    if not isinstance(raw, (bytes, Raw)):
        return raw
    try:
        return decode_json(raw)
    except msgspec.DecodeError as exc:
        try:
            bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise SGLangFormatError(
                f"forward_ct {_key(raw).forward_ct}: a string that is not valid UTF-8",
                "invalid_utf8",
            ) from None
        raise SGLangFormatError(f"not a step record: {exc}") from None


def convert_records(
    records: list,
    fields: dict,
    rank: int,
    refuse: Callable[[SGLangFormatError], object],
    workload_of: WorkloadOf = _no_workload,
) -> list[StepBatch]:
    """Records of one rank (at most a chunk; JSON text, or decoded) as steps, in their
    order: in one pass over their text where every one is plainly valid, else record by
    record, each bad one handed to `refuse` with its reason and the rest kept."""
    if all(isinstance(r, (bytes, Raw)) for r in records):
        text = Raw(b"[" + b",".join(records) + b"]")
        try:
            batches = _columnar_batches(
                msgspec.json.encode({**fields, "records": text}), rank, workload_of
            )
        except (InvalidBatch, TypeError, ValueError, msgspec.MsgspecError):
            batches = None
        if batches is not None:
            return batches
    out = []
    for raw in records:
        try:
            rec = decode_step_record(_decode_record(raw))
            out.append(
                record_to_batch(
                    rec,
                    gamma=fields["gamma"],
                    mode=fields["mode"],
                    rank=rank,
                    workload_of=workload_of,
                )
            )
        except SGLangFormatError as exc:
            refuse(exc)
    return out
