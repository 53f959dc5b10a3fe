#!/usr/bin/env bash
# The full run: every tier the fast one leaves out, on both ONNX Runtime packages. CI (.ci/run) runs it right after
# the README's test command (the fast tier). Each part prints --durations=25 so every run shows where time goes.
#
#   bash scripts/full_run.sh            # setup --full, then the parts below
#
# 1. .venv (onnxruntime-webgpu): the slow tier (nbval, the browsers, nested suites such as the debug allocator's,
#    long runs, SmolLM2) and the property tests again with many examples (--hypothesis-profile=full).
# 2. .venv-plugin (onnxruntime + onnxruntime-ep-webgpu): every test marked `package` (its outcome can depend on
#    the ONNX Runtime package: tests/tiers.py), fast and slow.
# 3. The docs site, built with warnings as errors (a test of the slow tier: tests/test_docs.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --full

run() {  # run NAME COMMAND...: one part, timed
  local name="$1" start=$SECONDS
  shift
  echo "[kvlab full run] $name: $*"
  "$@"
  echo "[kvlab full run] $name: passed in $((SECONDS - start)) s"
}

run "slow tier (onnxruntime-webgpu)" .venv/bin/python -m pytest -m "slow or hypothesis" --hypothesis-profile=full
run "package tests (onnxruntime + plugin EP)" .venv-plugin/bin/python -m pytest -m package -p no:cacheprovider
echo "[kvlab full run] done in $SECONDS s"
