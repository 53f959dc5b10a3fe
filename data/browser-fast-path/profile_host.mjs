// Where the page's decode step goes: the runner (kvlab/web/js/runner.mjs) in Node with Dawn, as node_host.mjs runs
// it, with one of onnxruntime-web's WebGPU builds and one of three modes over a window of decode steps.
//
// Usage: node profile_host.mjs JOB.json MODEL_DIR NODE_MODULES OUT.json TOGGLES BUNDLE MODE FROM STEPS
//   BUNDLE  webgpu: ort.webgpu.bundle.min.mjs, the WebGPU EP built from C++ (asyncify wasm; kvlab's runner uses it)
//           jspi:   ort.jspi.bundle.min.mjs, the same EP on WebAssembly's promise integration (onnxruntime-web
//                   >= 1.31; a Node with JSPI: 24 with --experimental-wasm-jspi)
//           jsep:   ort.bundle.min.mjs, the JavaScript WebGPU EP (JSEP wasm)
//   MODE    time:    nothing added
//           profile: V8's sampling profiler (node:inspector) over the steps FROM .. FROM+STEPS-1 (counted over the
//                    whole job, warm-up included); the profile goes to OUT.json's name with .cpuprofile
//           count:   every WebGPU call the runtime makes in that window counted by name
// Writes the runner's result, plus {bundle, mode, window: {from, steps, ms}, calls}, to OUT.json.

import fs from 'node:fs';
import inspector from 'node:inspector';
import { runJob } from '../../kvlab/web/js/runner.mjs';
import { finish, jobBytes, nodeHost, openNodeRuntime } from '../../kvlab/web/js/node_runtime.mjs';

const [jobFile, modelDir, modules, outFile, toggles, bundle, mode, fromArg, stepsArg] = process.argv.slice(2);
const from = Number(fromArg);
const last = from + Number(stepsArg) - 1;
const COUNTED = {
  GPUDevice: ['createBindGroup', 'createBuffer', 'createCommandEncoder', 'createComputePipeline'],
  GPUQueue: ['writeBuffer', 'submit', 'onSubmittedWorkDone'],
  GPUCommandEncoder: ['beginComputePass', 'copyBufferToBuffer', 'finish'],
  GPUComputePassEncoder: ['setPipeline', 'setBindGroup', 'dispatchWorkgroups', 'end'],
  GPUBuffer: ['mapAsync', 'getMappedRange', 'unmap', 'destroy'],
};

const calls = {};
let counting = false;

function countCalls(globals) {
  for (const [cls, names] of Object.entries(COUNTED)) {
    for (const name of names) {
      const original = globals[cls].prototype[name];
      if (typeof original !== 'function') continue;
      const key = `${cls}.${name}`;
      globals[cls].prototype[name] = function counted(...args) {
        if (counting) calls[key] = (calls[key] ?? 0) + 1;
        return original.apply(this, args);
      };
    }
  }
}

const session = new inspector.Session();
const post = (method, params = {}) =>
  new Promise((resolve, reject) => session.post(method, params, (err, r) => (err ? reject(err) : resolve(r))));
let step = 0;
let t0 = 0;
const window = { from, steps: last - from + 1, ms: null };
let profiling = null;

// asked before every step (the runner's cancelled hook): opens and closes the window, never cancels
function atStep() {
  step += 1;
  if (step === from) {
    t0 = performance.now();
    if (mode === 'count') counting = true;
    if (mode === 'profile') profiling = post('Profiler.start');
  }
  if (step === last + 1) {
    window.ms = performance.now() - t0;
    counting = false;
    if (mode === 'profile') {
      profiling = profiling
        .then(() => post('Profiler.stop'))
        .then(({ profile }) => fs.writeFileSync(outFile.replace(/\.json$/, '.cpuprofile'), JSON.stringify(profile)));
    }
  }
  return false;
}

await finish(outFile, async () => {
  const job = JSON.parse(fs.readFileSync(jobFile, 'utf8'));
  const onSharedCopy = () => {
    if (counting) calls['copies of shared views'] = (calls['copies of shared views'] ?? 0) + 1;
  };
  const { ort, gpu, globals } = await openNodeRuntime({ modules, toggles, bundle, onSharedCopy });
  if (mode === 'count') countCalls(globals);
  session.connect();
  if (mode === 'profile') {
    await post('Profiler.enable');
    await post('Profiler.setSamplingInterval', { interval: 100 });
  }
  const bytes = jobBytes(job, modelDir);
  const result = await runJob({ ort, gpu, job, bytes, host: nodeHost(modules), transformers: null, cancelled: atStep });
  if (profiling) await profiling;
  return { ...result, bundle, mode, window, calls };
});
