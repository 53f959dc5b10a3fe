// The runner in Node with Dawn's bindings (the npm package "webgpu"): the same onnxruntime-web WebGPU code a
// browser runs, on a machine without a browser. It is Dawn in Node, not a browser: results say so.
//
// Usage: node node_host.mjs JOB.json MODEL_DIR NODE_MODULES OUT.json [TOGGLES]
// Reads the job kvlab/web/job.py wrote, the model's files from MODEL_DIR, the packages from NODE_MODULES; makes
// Dawn's instance with TOGGLES (comma-separated Dawn toggles, e.g. "skip_validation,disable_robustness"; none:
// Dawn's defaults) enabled and names them in the host; writes the runner's result (or {"error": ...}) to OUT.json
// and exits 0, or 1 when it wrote an error.

import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { errorResult, jobFiles, runJob } from './runner.mjs';

const [jobFile, modelDir, modules, outFile, toggles = ''] = process.argv.slice(2);

// dawn.node's queue.writeBuffer refuses a view onto shared memory ("Invalid argument"), and onnxruntime-web's
// threaded wasm heap is shared: such a view is copied into plain memory first (one extra host copy per upload,
// which a browser does not make).
function shareableWrites(GPUQueue) {
  const write = GPUQueue.prototype.writeBuffer;
  GPUQueue.prototype.writeBuffer = function writeBufferUnshared(buffer, offset, data, dataOffset, size) {
    if (ArrayBuffer.isView(data) && data.buffer instanceof SharedArrayBuffer) {
      const start = data.byteOffset + (dataOffset ?? 0) * (data.BYTES_PER_ELEMENT ?? 1);
      const length = (size ?? data.length - (dataOffset ?? 0)) * (data.BYTES_PER_ELEMENT ?? 1);
      const copy = new Uint8Array(data.buffer, start, length).slice();
      return write.call(this, buffer, offset, copy, 0, copy.byteLength);
    }
    return write.call(this, buffer, offset, data, dataOffset, size);
  };
}

async function main() {
  const job = JSON.parse(fs.readFileSync(jobFile, 'utf8'));
  const { create, globals } = await import(pathToFileURL(path.join(modules, 'webgpu', 'index.js')).href);
  Object.assign(globalThis, globals);
  shareableWrites(globals.GPUQueue);
  const gpu = create(toggles ? [`enable-dawn-features=${toggles}`] : []);
  if (!globalThis.navigator) globalThis.navigator = {};
  Object.defineProperty(globalThis.navigator, 'gpu', { value: gpu, configurable: true });
  const ortFile = path.join(modules, 'onnxruntime-web', 'dist', 'ort.webgpu.bundle.min.mjs');
  const ort = await import(pathToFileURL(ortFile).href);
  const wasm = fs.readFileSync(path.join(modules, 'onnxruntime-web', 'dist', 'ort-wasm-simd-threaded.asyncify.wasm'));
  ort.env.wasm.wasmBinary = wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength);
  const bytes = {};
  const files = jobFiles(job).filter((f) => f !== job.model.transformers_graph); // the one made by kvlab, not on disk
  for (const f of files) bytes[f.name] = new Uint8Array(fs.readFileSync(path.join(modelDir, f.name)));
  const pkg = (name) => JSON.parse(fs.readFileSync(path.join(modules, name, 'package.json'), 'utf8')).version;
  const host = {
    kind: 'node',
    name: `Node ${process.versions.node} + Dawn (npm webgpu ${pkg('webgpu')})`,
    user_agent: '',
    node: process.versions.node,
  };
  return runJob({ ort, gpu, job, bytes, host, transformers: null });
}

let code = 0;
let result;
try {
  result = await main();
} catch (err) {
  result = errorResult(err);
  code = 1;
}
fs.writeFileSync(outFile, JSON.stringify(result));
// Dawn's instance keeps the event loop alive: leave once the result is written
process.exit(code);
