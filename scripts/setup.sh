#!/usr/bin/env bash
# Set up kvlab on a fresh machine, idempotently: scripts/setup.py does the work (the standard library of Python
# only, so it also runs where there is no bash: `python scripts/setup.py` on Windows and macOS). Same flags:
#
#   bash scripts/setup.sh          # everything needed to run kvlab and its notebooks
#   bash scripts/setup.sh --test   # ... plus what the fast test tier needs (pytest, hypothesis, ruff, the kernel)
#   bash scripts/setup.sh --full   # ... plus what the full run needs (Chromium, the docs tools, .venv-optimum,
#                                  #     .venv-plugin)
#   bash scripts/setup.sh --plugin # ... plus .venv-plugin: kvlab on onnxruntime + the WebGPU plugin EP
#
# It runs setup.py with $PYTHON when set, else with the first of python3, python3.14 ... python3.11 that is at
# least 3.11 (onnxruntime-webgpu 1.27.0 has wheels for CPython 3.11-3.14).
set -euo pipefail
cd "$(dirname "$0")/.."
new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
if [ -n "${PYTHON:-}" ]; then
  new_enough "$PYTHON" && exec "$PYTHON" scripts/setup.py "$@"
  echo "setup.sh: kvlab needs Python >= 3.11; PYTHON=$PYTHON is $("$PYTHON" --version 2>&1)" >&2
  exit 1
fi
for py in python3 python3.14 python3.13 python3.12 python3.11; do
  command -v "$py" >/dev/null 2>&1 && new_enough "$py" && exec "$py" scripts/setup.py "$@"
done
echo "setup.sh: kvlab needs Python >= 3.11 and found none (python3 is $(python3 --version 2>&1)); set PYTHON=/path/to/python3.x" >&2
exit 1
