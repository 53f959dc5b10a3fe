// The runner in Node with Dawn's bindings (the npm package "webgpu"): the same onnxruntime-web WebGPU code a
// browser runs, on a machine without a browser. It is Dawn in Node, not a browser: results say so.
//
// Usage: node node_host.mjs JOB.json MODEL_DIR NODE_MODULES OUT.json [TOGGLES]
// Reads the job kvlab/web/job.py wrote, the model's files from MODEL_DIR, the packages from NODE_MODULES; makes
// Dawn's instance with TOGGLES (comma-separated Dawn toggles, e.g. "skip_validation,disable_robustness"; none:
// Dawn's defaults) enabled and names them in the host; writes the runner's result (or {"error": ...}) to OUT.json
// and exits 0, or 1 when it wrote an error.

import fs from 'node:fs';
import { runJob } from './runner.mjs';
import { finish, jobBytes, nodeHost, openNodeRuntime } from './node_runtime.mjs';

const [jobFile, modelDir, modules, outFile, toggles = ''] = process.argv.slice(2);

await finish(outFile, async () => {
  const job = JSON.parse(fs.readFileSync(jobFile, 'utf8'));
  const { ort, gpu } = await openNodeRuntime({ modules, toggles });
  return runJob({ ort, gpu, job, bytes: jobBytes(job, modelDir), host: nodeHost(modules), transformers: null });
});
