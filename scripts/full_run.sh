#!/usr/bin/env bash
# The full run: every tier the fast one leaves out, on both ONNX Runtime packages. CI (.ci/run) runs it right after
# the README's test command (the fast tier). Each part prints --durations=25, so every run shows where time goes.
#
#   bash scripts/full_run.sh
#
# After `setup.sh --full`, two parts run side by side; each writes its log to artifacts/, printed when both end:
# 1. .venv (onnxruntime-webgpu): the slow tier (nbval, the browsers, nested suites such as the debug allocator's,
#    long runs, SmolLM2, the docs build) and the property tests again with many examples (--hypothesis-profile=full),
#    in two workers (the browser tests all in one of them, in turn: --dist loadgroup). In one process it ran 2,684 s
#    against the second part's 1,642 s, alone on the cores for its last 17 minutes; in two, 2,148 s against 2,161 s
#    (the whole full run 2,721 -> 2,199 s, clean-clone rehearsals on the 2-core machine, 2026-12-03).
# 2. .venv-plugin (onnxruntime + onnxruntime-ep-webgpu): every test marked `package` (its outcome can depend on
#    the ONNX Runtime package: tests/tiers.py), fast and slow, one process.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/setup.sh --full
echo "[kvlab full run] setup --full: $((SECONDS - start)) s"
mkdir -p artifacts
# the models both parts load, and tests/test_any_decoder.py's exports of decoders built elsewhere, built before the
# parts start (not twice, by two parts at once; on a machine without them the exports alone outrun the fixture's
# share of pytest's timeout); with -c, as the builds' spawned processes need: a script read from stdin has no file
# they could start from
.venv/bin/python -c '
import sys, time
sys.path.insert(0, "tests")
from any_decoder import CASES, build_all
from conftest import MODELS, SLOW_MODELS, prebuild
t = time.perf_counter()
class Say:  # a failed build is said here; the tests that load that model then fail on their own
    def write_line(self, line, **_):
        print(f"[kvlab full run] {line}", file=sys.stderr)
prebuild(MODELS + SLOW_MODELS, Say())
print(f"[kvlab full run] models built in {time.perf_counter() - t:.0f} s")
t = time.perf_counter()
try:
    build_all(CASES)
except Exception as exc:  # said here; the matrix tests then fail on their own
    print(f"[kvlab full run] an export of the any-decoder matrix failed: {exc}", file=sys.stderr)
print(f"[kvlab full run] any-decoder exports ready in {time.perf_counter() - t:.0f} s")
'

# the timed guards, alone on the cores (tests/test_guards.py: kvlab's default CPU step against onnxruntime-genai's)
t=$SECONDS
.venv/bin/python -m pytest -m guard -s -p no:cacheprovider tests/test_guards.py
echo "[kvlab full run] guards: $((SECONDS - t)) s"

part() {  # part NAME LOG COMMAND...: one part, in the background, timed into its log
  local name="$1" log="$2"
  shift 2
  ( t=$SECONDS; "$@" > "$log" 2>&1; rc=$?; echo "[kvlab full run] $name: exit $rc after $((SECONDS - t)) s" >> "$log"; exit $rc ) &
}
part "slow tier (.venv, onnxruntime-webgpu)" artifacts/full-slow.log \
  .venv/bin/python -m pytest -n 2 --dist loadgroup -m "(slow or hypothesis) and not guard" --hypothesis-profile=full -p no:cacheprovider
slow=$!
part "package tests (.venv-plugin, onnxruntime + plugin EP)" artifacts/full-plugin.log \
  .venv-plugin/bin/python -m pytest -n 0 -m package -p no:cacheprovider
plugin=$!
rc=0
wait "$slow" || rc=1
wait "$plugin" || rc=1
cat artifacts/full-slow.log artifacts/full-plugin.log
echo "[kvlab full run] $([ $rc = 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
exit $rc
