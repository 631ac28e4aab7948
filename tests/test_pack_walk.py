"""The hook's tail walk held to THE tail walk: the numpy form of `estimator/tails.py`.

The hook walks each request slot's open tails on the device as steps arrive, and where a
sampled tail first differs from the tokens a step commits it gathers the target's
log-probability of the tail's draft from that step's verify row: a (batch row, verify
row, token) triple and its value, written into the packed step. The numpy walker does not
gather: it asks its `gather` for exactly those triples at the step that commits the
mismatch. The adapter here feeds it the same steps (as the synchronous reference's
StepBatches, `tests/hook_reference.py`) and records what it asks; the device's walk must
have gathered those triples, and no others where no request leaves its slot. The values
are held to the reference's own log-probabilities.

Here the torch form runs on CPU; tests/test_pack_triton_gpu.py holds the Triton kernel to
the same adapter on a GPU. (The C walker is held to the numpy form block for block by
tests/test_tails_compiled.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dspark_obs.estimator.tails import TailWalker  # noqa: E402

from dspark_obs.hooks.observed_step import ObservedStep  # noqa: E402
from dspark_obs.hooks.pack_torch import TorchPacker  # noqa: E402
from dspark_obs.hooks.step_layout import StepLayout  # noqa: E402
from tests.hook_reference import StepStream, reference_batch  # noqa: E402

Triple = tuple[int, int, int]


class NumpyWalk:
    """The adapter: the numpy walker over the reference's batches, recording every gather it
    asks for (and answering it from the reference, so its blocks walk on as they would)."""

    def __init__(self, gamma: int) -> None:
        self.walker = TailWalker(gamma, compiled=False, walk_every=1 << 30)

    def step(self, kw: dict, gamma: int) -> tuple[set[Triple], dict[Triple, float]]:
        batch, gather = reference_batch(kw, gamma)
        asked: dict[Triple, float] = {}

        def recording(rows, positions, tokens):
            values = gather(rows, positions, tokens)
            for key, value in zip(
                zip(rows.tolist(), positions.tolist(), tokens.tolist(), strict=True),
                values.tolist(),
                strict=True,
            ):
                asked[key] = value
            return values

        self.walker.step(batch, np.zeros(batch.num_reqs, dtype=np.int64), recording)
        return set(asked), asked


def device_gathers(block: np.ndarray, layout: StepLayout) -> dict[Triple, float]:
    """The packed step's gathers: (batch row, verify row, token) -> log-probability."""
    c = layout.columns
    offsets, tokens = block[:, c["gather_offset"]], block[:, c["gather_token"]]
    values = block[:, c["gather_logprob"]]
    rows, slots = np.nonzero(offsets >= 0)
    return {
        (int(r), int(offsets[r, k]), int(tokens[r, k])): float(values[r, k])
        for r, k in zip(rows.tolist(), slots.tolist(), strict=True)
    }


def held_to_the_numpy_walk(stream: StepStream, steps: int, pack, place=None) -> dict[str, int]:
    """Run `steps` of the stream through `pack(step, seq) -> block` and the numpy walk; every
    gather the walk asks for must be in the block with the reference's value. `place` moves
    an observer call's tensors to the packer's device. Returns the counts: asked, gathered
    (by the device), extra (gathered but not asked) and evicted."""
    layout = StepLayout(stream.g)
    walk = NumpyWalk(stream.g)
    counts = dict(asked=0, gathered=0, extra=0, evicted=0)
    for seq in range(1, steps + 1):
        kw = stream.step()
        block = pack(ObservedStep.from_observer(kw if place is None else place(kw)), seq)
        asked, want = walk.step(kw, stream.g)
        got = device_gathers(block, layout)
        missing = asked - set(got)
        assert not missing, f"step {seq}: the device did not gather {sorted(missing)}"
        for key in asked:
            assert got[key] == pytest.approx(want[key], abs=1e-5), (seq, key)
        counts["asked"] += len(asked)
        counts["gathered"] += len(got)
        counts["extra"] += len(set(got) - asked)
        counts["evicted"] += int(np.count_nonzero(block[:, layout.col("evicted")] == 1))
    return counts


def torch_form(gamma: int, pool_slots: int = 64):
    layout = StepLayout(gamma)
    packer = TorchPacker(layout, pool_slots, "cpu")
    out = torch.empty((pool_slots, layout.width), dtype=torch.float64)

    def pack(step: ObservedStep, seq: int) -> np.ndarray:
        packer.pack(step, seq, 0, out, 0)
        return out[: step.bs].numpy().copy()

    return pack


#: Streams whose walks run on over several steps: sampled requests whose drafts mostly agree
#: with the committed tokens, a mixed batch, a greedy draft, a wider gamma.
STREAMS = {
    "sampled-long-tails": dict(greedy_every=0, agree=0.9, vocab=6),
    "mixed": dict(agree=0.8, vocab=8),
    "greedy-draft": dict(greedy_draft=True, greedy_every=3, agree=0.85, vocab=6),
    "gamma-7": dict(gamma=7, greedy_every=0, agree=0.9, vocab=5),
}


@pytest.mark.parametrize("options", STREAMS.values(), ids=STREAMS.keys())
def test_the_torch_walk_gathers_what_the_numpy_walk_asks_for(options):
    """No request leaves its slot and none takes another's: the device and the numpy walk
    follow the same tails, so the gathers are the same triples exactly."""
    stream = StepStream(seed=13, requests=10, **options)
    stream.churn = lambda: None
    counts = held_to_the_numpy_walk(stream, 150, torch_form(stream.g))
    assert counts["asked"] > 40  # tails ran on and were resolved by later mismatches
    assert counts["extra"] == 0 and counts["evicted"] == 0


def test_a_slot_taken_over_at_another_position_drops_its_tails():
    """A finished request's slot taken by a new one whose prefix does not continue the old
    one's: the device drops the slot's tails (its walk would read unrelated tokens), as the
    numpy walk stops following them, so again the gathers are the same triples exactly."""
    stream = StepStream(seed=17, requests=10, greedy_every=0, agree=0.9, vocab=6)
    replaced = []

    def replace_one():
        if stream.rng.random() < 0.1:
            i = int(stream.rng.integers(len(stream.reqs)))
            old = stream.reqs[i]
            stream.reqs[i] = stream._new_request(prefix=old["prefix"] - 3, slot=old["slot"])
            replaced.append(i)

    stream.churn = replace_one
    counts = held_to_the_numpy_walk(stream, 150, torch_form(stream.g))
    assert len(replaced) > 5 and counts["asked"] > 40
    assert counts["extra"] == 0 and counts["evicted"] == 0


def test_a_slot_taken_over_at_the_same_position_only_adds_gathers():
    """A finished request's slot taken by a new one at the very position it would have
    continued from: the device, which sees no request ids, walks the old tail on and gathers
    for it; the numpy walk parks it under its rid. A gather nobody asks for is never read
    (the consumer matches by triple), so the walk's own requests must all be there."""
    stream = StepStream(seed=21, requests=10, greedy_every=0, agree=0.9, vocab=6, moves=False)
    counts = held_to_the_numpy_walk(stream, 200, torch_form(stream.g))
    assert counts["asked"] > 40 and counts["evicted"] == 0
