"""The fleet folds on Ray against in process: `summary --by node,rank`, `calibration --by
node`, `estimate --by node` and `report --by node` over 8 run directories of 10 million
request-steps in all (quick: 200k; `BENCH_FLEET_RAY_REQUEST_STEPS` sets another size,
`BENCH_FLEET_RAY_COMMANDS` a comma-separated subset of the commands), each in process and
with `--engine ray` on a local cluster of one and of two one-CPU worker nodes (a head with
no CPU, so every task runs on a worker; quick: two only, a crash check of the same code).

The runs are `fleet_posthoc`'s reference run tiled once into one node's run; the other 7
nodes' runs hard-link its parts (each with its own run.json naming its node), so the
generation and the disk are one run's. Each command is a child process, so its time
includes start-up, imports and, on Ray, joining the cluster; its peak RSS is the driver's
alone (`time_child`): the workers' memory is not the driver's, and the driver's must not
grow with the data. Configurations alternate within each repeat (each cluster started
afresh), so each sees the same load; the load average is recorded before and after. Ray's
`--json` (and the report's report.json) must equal the in-process one to 1e-9, or the
benchmark crashes.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from .common import record, time_child
from .fleet_posthoc import NODES, make_fleet

FULL_REQUEST_STEPS = 10_000_000
QUICK_REQUEST_STEPS = 200_000
COMMANDS = {
    "summary": ["--by", "node,rank", "--json"],
    "calibration": ["--by", "node", "--json"],
    "estimate": ["--by", "node", "--json"],
    "report": ["--by", "node", "--quiet", "--out"],  # + its directory; report.json compared
}
#: configuration: worker nodes of one CPU (0: in process)
CONFIGS = {"in_process": 0, "ray_1_worker": 1, "ray_2_workers": 2}
QUICK_CONFIGS = ("in_process", "ray_2_workers")


def _same(a, b, where: str) -> None:
    if isinstance(a, dict):
        if set(a) != set(b):
            raise AssertionError(f"{where}: keys differ")
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        if len(a) != len(b):
            raise AssertionError(f"{where}: lengths differ")
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        if not (math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (a != a and b != b)):
            raise AssertionError(f"{where}: {a} != {b}")
    elif a != b:
        raise AssertionError(f"{where}: {a!r} != {b!r}")


def _cluster(workers: int):
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(workers):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    return c


def _output(name: str, stdout: bytes, out_dir: Path) -> dict:
    if name == "report":
        return json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
    return json.loads(stdout)


def run(quick: bool) -> list[dict]:
    wanted = int(
        os.environ.get("BENCH_FLEET_RAY_REQUEST_STEPS")
        or (QUICK_REQUEST_STEPS if quick else FULL_REQUEST_STEPS)
    )
    repeats = 1 if quick else int(os.environ.get("BENCH_FLEET_RAY_REPEATS", "2"))
    py = [sys.executable, "-m", "dspark_obs"]
    chosen = os.environ.get("BENCH_FLEET_RAY_COMMANDS")
    commands = {n: COMMANDS[n] for n in chosen.split(",")} if chosen else COMMANDS
    configs = {c: CONFIGS[c] for c in (QUICK_CONFIGS if quick else CONFIGS)}
    timings = {(c, n): ([], []) for c in configs for n in commands}
    outputs: dict = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-ray-") as tmp:
        start = time.perf_counter()
        fleet, manifest = make_fleet(Path(tmp), wanted, link=True)
        generate_s = time.perf_counter() - start
        for _ in range(repeats):
            for config, workers in configs.items():
                cluster = _cluster(workers) if workers else None
                engine = ["--engine", "ray", "--ray-address", cluster.address] if cluster else []
                try:
                    for name, extra in commands.items():
                        out_dir = Path(tmp) / f"report-{config}"
                        cmd = [*py, name, str(fleet), *extra]
                        cmd += [str(out_dir)] if name == "report" else []
                        seconds, rss, out = time_child([*cmd, *engine])
                        timings[config, name][0].append(seconds)
                        timings[config, name][1].append(rss)
                        outputs[config, name] = _output(name, out, out_dir)
                finally:
                    if cluster is not None:
                        cluster.shutdown()
    load_after = os.getloadavg()
    for (config, name), got in outputs.items():
        _same(got, outputs["in_process", name], f"{config} {name}")
    request_steps = manifest["request_steps"] * NODES
    out = []
    for (config, name), (seconds, rss) in timings.items():
        base = min(timings["in_process", name][0])
        out.append(
            record(
                f"fleet_ray_{name}_{config}",
                {"runs": NODES, "request_steps": request_steps, "workers": CONFIGS[config]},
                "s_per_command",
                seconds,
                1.0,
                seconds=seconds,
                peak_driver_rss_mb=max(rss),
                rows_per_s=request_steps / min(seconds),
                speedup_vs_in_process=base / min(seconds),
                generate_seconds=generate_s,
                load_average_before=load_before,
                load_average_after=load_after,
            )
        )
    return out


if __name__ == "__main__":
    from .common import run_alone

    run_alone(run)
