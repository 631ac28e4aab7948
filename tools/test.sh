#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run it.
# The README's second set-up command; CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
# Compiled modules are cached (__pycache__, ignored by git) even where the environment turns
# that off: the tests start a few hundred `dspark-obs` processes and each pytest process
# rewrites every test module's asserts, each compiling its modules afresh otherwise.
unset PYTHONDONTWRITEBYTECODE

# A real Prometheus server (and promtool) for the integration tests: Debian's own package.
# Installed in the background while the Python environment is built; the tests wait for it.
install_prometheus() {
    if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
        return 0
    fi
    # Keep the package's maintainer scripts from starting a service: there is no init system
    # here, and a background server would hold port 9090. policy-rc.d exit 101 tells
    # invoke-rc.d "not allowed"; any policy-rc.d already present is put back afterwards.
    local policy=/usr/sbin/policy-rc.d
    saved=""
    if [ -e "$policy" ]; then
        saved="$(mktemp)"
        cp -p "$policy" "$saved"
    fi
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    restore_policy() {
        if [ -n "$saved" ]; then mv -f "$saved" /usr/sbin/policy-rc.d; else rm -f /usr/sbin/policy-rc.d; fi
    }
    trap restore_policy EXIT
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        prometheus </dev/null
    restore_policy
    trap - EXIT
    # Belt and braces: if the packaged service got started anyway, stop exactly that process
    # (its init script's pidfile), so nothing lingers on port 9090.
    if [ -f /run/prometheus/prometheus.pid ]; then
        start-stop-daemon --stop --quiet --oknodo --retry=TERM/10/KILL/5 \
            --pidfile /run/prometheus/prometheus.pid --remove-pidfile || true
    fi
}
prometheus_log="$(mktemp)"
install_prometheus >"$prometheus_log" 2>&1 &
prometheus_install=$!

python3 -m venv .venv
PY=.venv/bin/python
main_packages="$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# Written once .venv holds everything; the side environments wait for it (below).
main_ready="$(mktemp -d)/ready"

# SGLang's own DSpark observer and draft-block types, on CPU (tests/test_sglang_real_types.py;
# tests/test_sglang_block_accept_writer.py holds our block-accept JSONL against its recorder;
# tests/test_node_consumer.py turns the hook on through its --forward-hooks plugin point),
# and vLLM 0.33.0's runner, sampler and adaptive verification types (tests/test_vllm_hook.py),
# each in an environment of its own: both pin versions of their own (torch 2.14.1 among
# them), so each goes in without its dependencies, beside exactly what its imported modules
# need (tools/*-requirements.txt). Such an environment sees the first one's packages after
# its own (a site hook, not a copy): torch 2.13.0 and our package, compiled extensions
# included, come from there instead of being unpacked and built again, and what it pins
# itself comes first. The engine itself (most of the download and the unpacking) goes in
# while .venv is installed; what it needs beside it once .venv is complete, so that what
# .venv holds is not installed twice. pip then reports the engine's own pins as unmet;
# expected.
build_side_env() { # environment, engine==version, requirements file
    local env="$1" own
    python3 -m venv "$env"
    "$env/bin/python" -m pip install --quiet --upgrade pip
    "$env/bin/python" -m pip install --quiet --no-deps "$2"
    while [ ! -e "$main_ready" ]; do
        kill -0 $$ 2>/dev/null || exit 1 # the command stopped before .venv was complete
        sleep 1
    done
    own="$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    printf 'import site; site.addsitedir(%s)\n' "'$main_packages'" >"$own/zz-main-environment.pth"
    "$env/bin/python" -m pip install --quiet -r "$3" pytest
}
sglang_log="$(mktemp)"
build_side_env .venv-sglang sglang==0.5.23 tools/sglang-requirements.txt >"$sglang_log" 2>&1 &
sglang_build=$!
vllm_log="$(mktemp)"
build_side_env .venv-vllm vllm==0.33.0 tools/vllm-requirements.txt >"$vllm_log" 2>&1 &
vllm_build=$!

$PY -m pip install --quiet --upgrade pip
# CPU build of torch first: an unpinned install would pull a CUDA build of several GB.
$PY -m pip install --quiet torch==2.13.0
$PY -m pip install --quiet -e '.[dev,torch,ray]'
touch "$main_ready"

$PY -m ruff check .
# Static security checks (skips and the few `# nosec` are justified in pyproject / inline)
# and known vulnerabilities in what is installed (fails on any finding; an unreachable
# advisory service only prints that nothing was audited: docs/security.md, "Hardening and
# limits"), beside the tests: mostly a wait on the advisory service.
checks_log="$(mktemp)"
{
    $PY -m bandit -q -r src estimator exporters -c pyproject.toml
    $PY tools/audit.py
} >"$checks_log" 2>&1 &
checks=$!
# The compiled extensions must be built here (README, "C extensions"): with this set, the
# tests of tests/test_extensions.py fail where one is missing instead of skipping.
# Three workers on the two cores, a test file each at a time: a file's fixtures are built
# once, and while a test waits on a subprocess or a server (a sixth of the two cores' time
# with two workers) the third keeps the core busy.
# Files go out in the order collected, those holding a `slow` test first (tests/conftest.py):
# a long file handed out last would run alone, the other cores idle.
if ! wait "$prometheus_install"; then
    cat "$prometheus_log"
    echo "tools/test.sh: installing Prometheus failed" >&2
    exit 1
fi
# A background run's output once it ends, and its failure as the command's.
finish() {
    local status=0
    wait "$1" || status=$?
    cat "$2"
    if [ "$status" -ne 0 ]; then
        echo "tools/test.sh: $3 failed" >&2
        exit 1
    fi
}
DSPARK_OBS_REQUIRE_EXTENSIONS=1 $PY -m pytest -n 3 --dist loadfile --no-loadscope-reorder "$@"
finish "$checks" "$checks_log" "the static security checks or the audit"
if ! wait "$sglang_build"; then
    cat "$sglang_log"
    echo "tools/test.sh: building the SGLang test environment failed" >&2
    exit 1
fi
if ! wait "$vllm_build"; then
    cat "$vllm_log"
    echo "tools/test.sh: building the vLLM test environment failed" >&2
    exit 1
fi
# The last steps overlap, all started at once so that the two cores stay busy until the
# last ends: the SGLang and vLLM environments' tests (mostly starting up, or waiting on a
# Prometheus scrape), the quick benchmarks in two halves, and the fallbacks' tests.
# The one-flag deployment: two DP ranks through SGLang's own register_forward_hooks and
# DsparkStepObservers, one node consumer, a real Prometheus (tests/test_node_consumer.py).
sglang_tests_log="$(mktemp)"
.venv-sglang/bin/python -m pytest -p no:cacheprovider tests/test_sglang_real_types.py \
    tests/test_sglang_block_accept_writer.py \
    "tests/test_node_consumer.py::test_every_rank_of_a_node_on_one_scrape_target[sglang]" \
    >"$sglang_tests_log" 2>&1 &
sglang_tests=$!
vllm_tests_log="$(mktemp)"
.venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/test_vllm_hook.py \
    tests/test_vllm_topk.py \
    >"$vllm_tests_log" 2>&1 &
vllm_tests=$!
# The quick benchmarks are a crash check (they fail on a crash, never on a timing: bench/).
# Those that start clusters or subprocesses, or build the largest runs, in one process (about
# as long as the rest together); every other one in another. Both append their records to
# one file, a line each.
bench_first="fleet_ray report_large hook_import real_cost store_write gpu_gather"
# shellcheck disable=SC2086 # the names are words
bench_second="$($PY -c 'import sys
from bench.__main__ import BENCHMARKS
print(*(name for name in BENCHMARKS if name not in sys.argv[1:]))' $bench_first)"
: >bench-quick.jsonl
# shellcheck disable=SC2086 # the names are words
$PY -m bench --quick --json $bench_first >>bench-quick.jsonl &
bench=$!
# shellcheck disable=SC2086 # the names are words
$PY -m bench --quick --json $bench_second >>bench-quick.jsonl &
bench_rest=$!
trap 'kill "$bench" "$bench_rest" "$sglang_tests" "$vllm_tests" 2>/dev/null || true' EXIT
# The compiled extensions' Python fallbacks, with every extension switched off: the switch
# itself, the parser's tests and the end-to-end golden outputs. (The row fold's and the tail
# walk's tests run both passes above already, the numpy one and the compiled one, so they are
# not repeated here.)
DSPARK_OBS_NO_EXTENSIONS=1 $PY -m pytest -p no:cacheprovider \
    tests/test_extensions.py tests/test_sglang_json.py tests/test_sglang_columnar.py \
    tests/test_sglang_compiled.py tests/test_golden_outputs.py -k "not across_seeds"
finish "$sglang_tests" "$sglang_tests_log" "the SGLang environment's tests"
finish "$vllm_tests" "$vllm_tests_log" "the vLLM environment's tests"
finish "$bench" /dev/null "the quick benchmarks (bench-quick.jsonl has what they printed)"
finish "$bench_rest" /dev/null "the quick benchmarks (bench-quick.jsonl has what they printed)"
trap - EXIT
