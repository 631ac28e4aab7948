"""`python -m bench [--json] [--quick] [NAME...]`.

Fails only on crashes, never on timings: machines are noisy; targets are
reported (`meets_target`) for people to read. Every figure also carries a
baseline measured in the same run, the same work done the way SGLang's own
DSpark observers do it (`bench/baselines.py`), and `ratio`: how many times
faster ours is (`ratio_target` / `meets_ratio_target` where there is one). A
baseline that does not compute the same numbers as ours is a crash.
"""

from __future__ import annotations

import argparse
import json
import sys

from dspark_obs.allocator import keep_freed_memory

from . import (
    aggregate_update,
    answer_memory,
    cli_startup,
    estimator_update,
    fleet_posthoc,
    fleet_ray,
    gpu_gather,
    hook_graph,
    hook_import,
    hook_step,
    ingest_memory,
    pack_kernel,
    real_cost,
    render_scrape,
    report_large,
    runtime_step,
    serve_throughput,
    sglang_load,
    sglang_paths,
    store_write,
    torch_verify,
    vllm_hook_step,
    whatif_large,
)
from .common import ALLOCATOR

BENCHMARKS = {
    "aggregate_update": aggregate_update,
    "estimator_update": estimator_update,
    "render_scrape": render_scrape,
    "report_large": report_large,
    "fleet_posthoc": fleet_posthoc,
    "fleet_ray": fleet_ray,
    "serve_throughput": serve_throughput,
    "gpu_gather": gpu_gather,
    "hook_import": hook_import,
    "hook_step": hook_step,
    "hook_graph": hook_graph,
    "pack_kernel": pack_kernel,
    "sglang_paths": sglang_paths,
    "cli_startup": cli_startup,
    "torch_verify": torch_verify,
    "sglang_load": sglang_load,
    "answer_memory": answer_memory,
    "whatif_large": whatif_large,
    "ingest_memory": ingest_memory,
    "real_cost": real_cost,
    "store_write": store_write,
    "vllm_hook_step": vllm_hook_step,
    "runtime_step": runtime_step,
}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        choices=[*BENCHMARKS, []],
        metavar="NAME",
        help=f"benchmarks to run (default all): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (CI)")
    args = parser.parse_args()
    # the in-process benchmarks stand for `dspark-obs` processes, which keep freed memory
    # for reuse (dspark_obs/allocator.py); the baselines run in the same process
    ALLOCATOR["kept"] = keep_freed_memory()
    for name in args.names or BENCHMARKS:
        for rec in BENCHMARKS[name].run(args.quick):
            if args.json:
                print(json.dumps(rec), flush=True)
            elif "skipped" in rec:
                print(f"{rec['name']}: skipped ({rec['skipped']})", flush=True)
            else:
                target = f" (target {rec['target']})" if "target" in rec else ""
                ratio = ""
                if "ratio" in rec:
                    goal = f", target {rec['ratio_target']}" if "ratio_target" in rec else ""
                    ratio = (
                        f"; baseline {rec['baseline_median']:.2f}: ratio {rec['ratio']:.2f}{goal}"
                    )
                print(
                    f"{rec['name']} {rec['parameters']}: median {rec['median']:.2f} "
                    f"{rec['unit']} [p25 {rec['p25']:.2f}, p75 {rec['p75']:.2f}]{target}{ratio}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
