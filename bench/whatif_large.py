"""P3 for `whatif`: predictions and the cost-of-trimming headline on a 10M request-step run.

The run is P3's (`report_large`): the reference runtime's compact run with a
cap-accept shadow over a concurrency sweep 1..256, tiled until it holds at least 10M
request-steps (quick: ~200k). Timed, each as a child process (interpreter start-up and
imports included, as a user sees it; peak RSS from `os.wait4` for that child alone):

- `whatif RUN --json` with its default policies (own, static, sps, window=3,
  sps:scale=0.5), the SPS ones replaying the scheduler on every step;
- `summary RUN --json`, whose `trim_cost` (`whatif/trim_cost.py`: own against static)
  is the cost-of-trimming headline.

Both are held to P3's budget (15 s, 3 GiB). The baseline is `report` on the same run
in the same benchmark (P3 itself), so `ratio` says how `whatif` compares with the
budget's own reference on this machine: above 1, `whatif` is the faster.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .common import record, run_alone, with_baseline
from .report_large import (
    FULL_REQUEST_STEPS,
    QUICK_REQUEST_STEPS,
    TARGET_RSS_MB,
    TARGET_S,
    large_run,
    time_dspark,
)


def _timed(repeats: int, *args: str | Path) -> tuple[list[float], list[float]]:
    seconds, rss = [], []
    for _ in range(repeats):
        s, r = time_dspark(*args)
        seconds.append(s)
        rss.append(r)
    return seconds, rss


def run(quick: bool) -> list[dict]:
    repeats = 1 if quick else 3
    large, manifest = large_run(QUICK_REQUEST_STEPS if quick else FULL_REQUEST_STEPS)
    copies, base_rs = manifest["copies"], manifest["base_request_steps"]
    generate_s = manifest["generate_seconds"]
    timed = {
        "whatif": _timed(repeats, "whatif", large, "--json"),
        "summary": _timed(repeats, "summary", large, "--json"),
    }
    with tempfile.TemporaryDirectory(prefix="bench-whatif-") as tmp:
        report_s, report_rss = _timed(1, "report", large, "--out", Path(tmp) / "report", "--quiet")
    parameters = {
        "request_steps": manifest["request_steps"],
        "steps": manifest["steps"],
        "copies": copies,
        "base_request_steps": base_rs,
    }
    out = []
    for name, what in (
        ("whatif", "whatif --json, default policies"),
        ("summary", "summary --json, with the cost of trimming (trim_cost)"),
    ):
        seconds, rss = timed[name]
        rec = record(
            f"P3_{name}_large",
            parameters,
            "s_per_call",
            seconds,
            1.0,
            target=TARGET_S,
            what=what,
            seconds=seconds,
            peak_rss_mb=max(rss),
            peak_rss_mb_repeats=rss,
            rss_target_mb=TARGET_RSS_MB,
            meets_rss_target=max(rss) <= TARGET_RSS_MB,
            generate_seconds=generate_s,
        )
        out.append(
            with_baseline(
                rec,
                report_s,
                1.0,
                baseline="report on the same run (P3), timed in the same benchmark",
                baseline_peak_rss_mb=max(report_rss),
            )
        )
    return out


if __name__ == "__main__":
    run_alone(run)
