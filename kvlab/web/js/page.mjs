// The page kvlab's HTTP server (kvlab/web/server.py) serves on localhost: it reads the job and the npm files' URLs
// from /job, the model's files from /model/<name>, onnxruntime-web and transformers.js from /npm/..., runs the job
// and POSTs the result (or {error}) to /result; each finished step is POSTed to /progress as it happens.

import { errorResult, jobFiles, runJob } from './runner.mjs';
import { loadTransformers } from './tjs.mjs';
import { browserHost } from './host.mjs';

const log = document.getElementById('log');
const say = (text) => {
  log.textContent += `\n${text}`;
};

function post(path, body) {
  return fetch(path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

async function main() {
  const { job, assets } = await (await fetch('/job')).json();
  const ortUrl = new URL(assets.ort, location.href).href;
  const ort = await import(ortUrl);
  ort.env.wasm.wasmPaths = { wasm: new URL(assets['ort-wasm'], location.href).href };
  say(`onnxruntime-web ${ort.env.versions.web}; model ${job.model.name}`);
  const bytes = {};
  for (const f of jobFiles(job)) {
    bytes[f.name] = new Uint8Array(await (await fetch(`/model/${encodeURIComponent(f.name)}`)).arrayBuffer());
  }
  const transformers = async () => loadTransformers(ortUrl, await (await fetch(assets.transformers)).text());
  const onStep = (s) => {
    say(`step ${s.step}: ${s.wall_ms.toFixed(1)} ms`);
    post('/progress', s).catch(() => {});
  };
  return runJob({ ort, gpu: navigator.gpu, job, bytes, host: await browserHost(), transformers, onStep });
}

main().then(
  (result) => {
    say('done');
    return post('/result', result);
  },
  (err) => {
    say(`error: ${err?.message ?? err}`);
    return post('/result', errorResult(err));
  },
);
