#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run it.
# The README's second set-up command; CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
PY=.venv/bin/python
$PY -m pip install --quiet --upgrade pip
# CPU build of torch first: an unpinned install would pull a CUDA build of several GB.
$PY -m pip install --quiet torch==2.13.0
$PY -m pip install --quiet -e '.[dev,torch]'

$PY -m ruff check .
$PY -m pytest "$@"
