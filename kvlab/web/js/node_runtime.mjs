// onnxruntime-web's WebGPU code in Node with Dawn's bindings (the npm package "webgpu"): what node_host.mjs, and any
// other Node script that drives runner.mjs (data/browser-fast-path/profile_host.mjs), stand on.
//
// Contract:
// - openNodeRuntime({modules, toggles, bundle, onSharedCopy}) makes Dawn's instance with TOGGLES (comma-separated
//   Dawn toggles; '' for Dawn's defaults) enabled, installs it as navigator.gpu beside WebGPU's globals, imports
//   onnxruntime-web's BUNDLE from the node_modules folder MODULES ('webgpu': the EP built from C++, asyncify wasm,
//   the one the runner uses; 'jspi': the same EP on WebAssembly's promise integration instead of asyncify, from
//   onnxruntime-web 1.31 on, in a Node whose V8 has JSPI; 'jsep': the JavaScript EP) with its wasm, and returns
//   {ort, gpu, globals}. Every queue.writeBuffer of shared memory is copied into plain memory first, onSharedCopy()
//   called once per copy.
// - jobBytes(job, modelDir): {file name: Uint8Array} of the job's files read from MODEL_DIR (the transformers.js
//   graph, made by kvlab and sent in the job, left out).
// - nodeHost(modules): the host a result names.
// - finish(outFile, main): awaits main(), writes its result (or {"error": ...}) to OUT_FILE as JSON and exits the
//   process, 0 or 1 when it wrote an error (Dawn's instance would keep the event loop alive).

import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { errorResult, jobFiles } from './runner.mjs';

const BUNDLES = {
  webgpu: ['ort.webgpu.bundle.min.mjs', 'ort-wasm-simd-threaded.asyncify.wasm'],
  jspi: ['ort.jspi.bundle.min.mjs', 'ort-wasm-simd-threaded.jspi.wasm'],
  jsep: ['ort.bundle.min.mjs', 'ort-wasm-simd-threaded.jsep.wasm'],
};

// dawn.node's queue.writeBuffer refuses shared memory ("Invalid argument"), and onnxruntime-web's threaded wasm
// heap is shared: such data is copied into plain memory first (one extra host copy per upload, which a browser
// does not make)
function shareableWrites(GPUQueue, onSharedCopy) {
  const write = GPUQueue.prototype.writeBuffer;
  GPUQueue.prototype.writeBuffer = function writeBufferUnshared(buffer, offset, data, dataOffset, size) {
    let copy = null;
    if (data instanceof SharedArrayBuffer) {
      copy = new Uint8Array(data, dataOffset ?? 0, size ?? data.byteLength - (dataOffset ?? 0)).slice();
    } else if (ArrayBuffer.isView(data) && data.buffer instanceof SharedArrayBuffer) {
      const start = data.byteOffset + (dataOffset ?? 0) * (data.BYTES_PER_ELEMENT ?? 1);
      const length = (size ?? data.length - (dataOffset ?? 0)) * (data.BYTES_PER_ELEMENT ?? 1);
      copy = new Uint8Array(data.buffer, start, length).slice();
    }
    if (copy === null) return write.call(this, buffer, offset, data, dataOffset, size);
    onSharedCopy?.();
    return write.call(this, buffer, offset, copy, 0, copy.byteLength);
  };
}

export async function openNodeRuntime({ modules, toggles = '', bundle = 'webgpu', onSharedCopy = null }) {
  const { create, globals } = await import(pathToFileURL(path.join(modules, 'webgpu', 'index.js')).href);
  Object.assign(globalThis, globals);
  shareableWrites(globals.GPUQueue, onSharedCopy);
  const gpu = create(toggles ? [`enable-dawn-features=${toggles}`] : []);
  if (!globalThis.navigator) globalThis.navigator = {};
  Object.defineProperty(globalThis.navigator, 'gpu', { value: gpu, configurable: true });
  const [bundleFile, wasmFile] = BUNDLES[bundle];
  const ort = await import(pathToFileURL(path.join(modules, 'onnxruntime-web', 'dist', bundleFile)).href);
  const wasm = fs.readFileSync(path.join(modules, 'onnxruntime-web', 'dist', wasmFile));
  ort.env.wasm.wasmBinary = wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength);
  return { ort, gpu, globals };
}

export function jobBytes(job, modelDir) {
  const bytes = {};
  for (const f of jobFiles(job).filter((f) => f !== job.model.transformers_graph)) {
    bytes[f.name] = new Uint8Array(fs.readFileSync(path.join(modelDir, f.name)));
  }
  return bytes;
}

export function nodeHost(modules) {
  const pkg = (name) => JSON.parse(fs.readFileSync(path.join(modules, name, 'package.json'), 'utf8')).version;
  return {
    kind: 'node',
    name: `Node ${process.versions.node} + Dawn (npm webgpu ${pkg('webgpu')})`,
    user_agent: '',
    node: process.versions.node,
  };
}

export async function finish(outFile, main) {
  let code = 0;
  let result;
  try {
    result = await main();
  } catch (err) {
    result = errorResult(err);
    code = 1;
  }
  fs.writeFileSync(outFile, JSON.stringify(result));
  process.exit(code);
}
