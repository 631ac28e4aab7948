"""Train the real world's three networks, seeded: `python -m dspark_obs.runtime.real.train
--device cuda --out DIR [--seed S] [--stdlib DIR] [--tiny]`.

1. The target: next-byte cross-entropy on the three workloads' training text, windows drawn
   in proportion to each text's size, so every byte is seen about equally often (weighting
   a small text up makes the model learn it by heart: its held-out loss then rises).
2. The drafter, against the frozen target: at every anchor of a training sequence, the KL
   divergence from the target's next-byte distribution at each of the gamma following
   positions, the Markov head fed the true previous byte (teacher forcing). Distilling the
   target's whole distribution, not the text's bytes, is what acceptance rewards (greedy
   acceptance asks for the target's argmax, sampled acceptance for q close to p), and one
   target forward gives every position's teacher with no generation.
3. The confidence head, with both frozen: blocks drafted at the end of training contexts,
   half greedy and half sampled at T = 0.8, judged by the target (`evaluate.draft_and_verify`);
   binary cross-entropy against each token's acceptance probability, weighted by the
   probability that the chain reached it (the head predicts acceptance given the earlier
   tokens were accepted, which is what the runtime multiplies along the block).

A phase's step count is either given (`--target-steps`) or chosen from a time budget
(`--target-seconds`: the first steps are timed, the count fixed before the learning-rate
schedule depends on it); the count used is recorded, so passing it back reproduces the run.
The weights are written int8 (`weights.save`) and every figure in the JSON beside them is
measured on the reloaded, dequantized weights in float64.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import corpus
from .evaluate import anchor_contexts, bits_per_byte, draft_and_verify, survival_and_calibration
from .model import ModelConfig
from .weights import build, load, save

_TINY = ModelConfig(layers=1, width=32, heads=2, context=64, markov_width=16, confidence_width=8)
_SAMPLED_T = 0.8
_ANCHOR_CONTEXT = 128
#: held-out windows of the target's context whose loss is also recorded alone: the test
#: recomputes these on a CPU in seconds
CHECK_WINDOWS = 2
WEIGHTS_NAME = "real-models.npz"
METRICS_NAME = "real-models.json"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dspark_obs.runtime.real.train")
    ap.add_argument("--out", required=True, help="folder for the weights and their metrics")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stdlib", help="the standard library to train on (default: this Python's)")
    ap.add_argument("--tiny", action="store_true", help="a toy size for a smoke run on a CPU")
    ap.add_argument("--batch", type=int, default=64)
    for phase, steps in (("target", 10337), ("drafter", 7922), ("confidence", 2001)):
        ap.add_argument(f"--{phase}-steps", type=int, default=steps)
        ap.add_argument(
            f"--{phase}-seconds",
            type=float,
            help=f"choose the {phase}'s step count from this time budget instead",
        )
    args = ap.parse_args(argv)
    if args.batch < 1 or min(args.target_steps, args.drafter_steps, args.confidence_steps) < 1:
        ap.error("--batch and the step counts must be >= 1")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        ap.error(f"--device {args.device!r} is not a torch device (cpu, cuda, cuda:1, ...)")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this torch sees no CUDA device")
    return args


class _Sampler:
    """Random windows of the training text, a workload drawn in proportion to its size."""

    def __init__(self, texts: dict[str, bytes], device, gen: torch.Generator) -> None:
        self.data = {
            w: torch.frombuffer(bytearray(t), dtype=torch.uint8).to(device)
            for w, t in texts.items()
        }
        self.mix = torch.tensor([float(len(t)) for t in texts.values()])
        self.gen = gen

    def batch(self, rows: int, length: int) -> torch.Tensor:
        which = torch.multinomial(self.mix, rows, replacement=True, generator=self.gen)
        parts = []
        for i, data in enumerate(self.data.values()):
            n = int((which == i).sum())
            starts = torch.randint(0, len(data) - length, (n,), generator=self.gen)
            idx = starts.to(data.device)[:, None] + torch.arange(length, device=data.device)
            parts.append(data[idx])
        return torch.cat(parts).long()


def _train_phase(name, module, loss_fn, steps, seconds, lr, log) -> int:
    """AdamW with warm-up and cosine decay to a tenth; returns the step count used."""
    opt = torch.optim.AdamW(module.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = 100 if seconds is not None else max(1, min(100, steps // 10))
    # a time budget is turned into steps by timing steps settle..probe (the first ones
    # allocate and pick kernels), before the schedule past warm-up depends on the total
    settle, probe = 5, 25
    total = steps if seconds is None else None
    start = settled = time.perf_counter()
    step = 0
    while total is None or step < total:
        if step == settle:
            settled = time.perf_counter()
        if total is None and step == probe:
            now = time.perf_counter()
            per_step = (now - settled) / (probe - settle)
            total = probe + max(1, int((seconds - (now - start)) / per_step))
        frac = 0.0 if total is None else (step - warm) / max(1, total - warm)
        scale = (step + 1) / warm if step < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * frac))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        loss = loss_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        if step % 200 == 0 or step + 1 == total:
            took = time.perf_counter() - start
            log(f"{name} step {step}/{total} loss {float(loss.detach()):.4f} {took:.0f}s")
        step += 1
    return total


def _autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def train(args: argparse.Namespace, log=print) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    dev_gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    config = _TINY if args.tiny else ModelConfig()
    splits = {w: corpus.split(w, args.stdlib) for w in corpus.WORKLOADS}
    heldout_matches = {w: s.heldout == corpus.committed_heldout(w) for w, s in splits.items()}
    if not all(heldout_matches.values()):
        log("warning: this library's held-out cut differs from the committed sample")
    sampler = _Sampler({w: s.train for w, s in splits.items()}, device, gen)
    models = build(config)
    for m in models.modules().values():
        m.to(device)
    target, drafter, head = models.target, models.drafter, models.confidence
    ctx, g, rows = config.context, config.gamma, args.batch
    times = {}

    def target_loss():
        x = sampler.batch(rows, ctx + 1)
        with _autocast(device):
            logits, _ = target(x[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))

    def frozen_target(length):
        x = sampler.batch(rows, length)
        with torch.no_grad(), _autocast(device):
            logits, hidden = target(x)
        return x, logits.float(), hidden.float()

    def drafter_loss():
        seq = min(ctx, 256)
        x, logits, hidden = frozen_target(seq)
        anchors = seq - g
        teacher = logits[:, 1:].unfold(1, g, 1)[:, :anchors].transpose(2, 3)
        prev = x[:, 1:].unfold(1, g, 1)[:, :anchors]
        with _autocast(device):
            feats = drafter.features(
                hidden[:, :anchors].reshape(-1, config.width), x[:, 1 : anchors + 1].reshape(-1)
            )
            out, _ = drafter.logits(feats, prev.reshape(-1, g))
        p = F.softmax(teacher.reshape(-1, g, teacher.shape[-1]), dim=-1)
        logq = F.log_softmax(out.float(), dim=-1)
        return (p * (torch.log(p.clamp_min(1e-30)) - logq)).sum(-1).mean()

    def confidence_loss():
        x = sampler.batch(rows, _ANCHOR_CONTEXT)
        temp = torch.where(torch.arange(rows, device=device) % 2 == 0, 0.0, _SAMPLED_T)
        with torch.no_grad(), _autocast(device):
            acc, block = draft_and_verify(models, x, temp, dev_gen)
        acc = acc.float()
        reached = torch.cumprod(torch.cat([torch.ones_like(acc[:, :1]), acc[:, :-1]], 1), 1)
        block = replace(
            block, **{k: getattr(block, k).float() for k in ("logprobs", "features", "markov")}
        )
        logit = head(block)
        return (F.binary_cross_entropy_with_logits(logit, acc, reduction="none") * reached).mean()

    steps = {}
    plan = (
        ("target", target, target_loss, 2e-3),
        ("drafter", drafter, drafter_loss, 2e-3),
        ("confidence", head, confidence_loss, 1e-3),
    )
    for name, module, loss_fn, lr in plan:
        t0 = time.perf_counter()
        module.train()
        steps[name] = _train_phase(
            name,
            module,
            loss_fn,
            getattr(args, f"{name}_steps"),
            getattr(args, f"{name}_seconds"),
            lr,
            log,
        )
        module.eval()
        module.requires_grad_(False)
        times[name] = round(time.perf_counter() - t0, 1)

    save(models, out / WEIGHTS_NAME)
    t0 = time.perf_counter()
    metrics = measure(load(out / WEIGHTS_NAME, device=device), args.seed, args.tiny)
    metrics.update(
        seed=args.seed,
        steps=steps,
        batch=rows,
        train_seconds=times,
        measure_seconds=round(time.perf_counter() - t0, 1),
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        train_sha256={w: hashlib.sha256(s.train).hexdigest()[:16] for w, s in splits.items()},
        heldout_cut_matches=heldout_matches,
        train_bytes={w: len(s.train) for w, s in splits.items()},
        weights_bytes=(out / WEIGHTS_NAME).stat().st_size,
        config=config.to_dict(),
    )
    (out / METRICS_NAME).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return metrics


def measure(models, seed: int, tiny: bool = False) -> dict:
    """Every recorded figure, on the committed held-out samples."""
    device = next(models.target.parameters()).device
    context = models.config.context
    # a smoke run measures a sample (the first 8 windows, an anchor every 4 KB): its figures
    # only have to exist, and quickly
    stride, limit = (4096, 4 * CHECK_WINDOWS) if tiny else (64, None)
    per = {}
    for w in corpus.WORKLOADS:
        data = corpus.committed_heldout(w)
        contexts = anchor_contexts(data, _ANCHOR_CONTEXT, stride, device)
        per[w] = {
            "heldout_bytes": len(data),
            "bits_per_byte": round(bits_per_byte(models, data, context, limit), 5),
            "check_bits_per_byte": bits_per_byte(models, data, context, CHECK_WINDOWS),
            "greedy": survival_and_calibration(models, contexts, 0.0, seed),
            f"T{_SAMPLED_T}": survival_and_calibration(models, contexts, _SAMPLED_T, seed),
        }
    overall = {}
    for mode in ("greedy", f"T{_SAMPLED_T}"):
        n = np.array([per[w][mode]["anchors"] for w in corpus.WORKLOADS], dtype=float)
        s = np.array([per[w][mode]["survival"] for w in corpus.WORKLOADS])
        overall[mode] = {
            "survival": [round(float(v), 4) for v in n @ s / n.sum()],
            "mean_accepted": round(float((n @ s).sum() / n.sum()), 4),
        }
    return {
        "workloads": per,
        "overall": overall,
        "anchor_context": _ANCHOR_CONTEXT,
        "anchor_stride": stride,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        metrics = train(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(metrics["overall"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
