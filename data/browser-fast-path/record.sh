#!/usr/bin/env bash
# The browser fast path on this machine's GPU (data/browser-fast-path/README.md): onnxruntime-web in Node with Dawn,
# dynamic vs static vs captured with the token on the GPU, in kvlab's validation setting, beside the static page under
# the old one, kvlab's native static step and (--host-token) the page choosing the token from the logits, 1k-8k,
# paired and interleaved; results.json and record.log land next to this script.
#
#   bash data/browser-fast-path/record.sh            # on the GPU machine (phi4-kv fp32, 1k-8k, 64 new tokens, 3 rounds)
#   bash data/browser-fast-path/record.sh --tiny     # here, on SwiftShader, in under a minute: a check that it runs
#
# Node and the npm files come from .webnode/kvlab-web-node.tar.xz (python data/what-a-static-cache-buys/browser-node/
# pack_node.py makes it) unless KVLAB_NODE / KVLAB_WEB_ASSETS already point at them, as data/record_gpu.sh does.
# Extra arguments go to record.py (--contexts, --new-tokens, --reps, --model, --precision, --adapter, --host, --out,
# --host-token, --no-native, --budget-s).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
export PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"  # this checkout's kvlab where none is installed (after any given)
if [ "${1:-}" = "--tiny" ]; then  # kvlab's own model cache, the SwiftShader adapter, results under artifacts/
  exec "${PYTHON:-python3}" "$here/record.py" --adapter swiftshader "$@"
fi
export KVLAB_CACHE_DIR=${KVLAB_CACHE_DIR:-$PWD/.cache-gpu}  # as data/record_gpu.sh: models built on that machine
if [ -z "${KVLAB_WEB_ASSETS:-}" ] && [ -f .webnode/kvlab-web-node.tar.xz ]; then
  "${PYTHON:-python3}" -m tarfile -e .webnode/kvlab-web-node.tar.xz /tmp/kvlab-webnode
  export KVLAB_NODE=/tmp/kvlab-webnode/bin/node KVLAB_WEB_ASSETS=/tmp/kvlab-webnode/node_modules
fi
"${PYTHON:-python3}" "$here/record.py" "$@" 2>&1 | tee "$here/record.log"
