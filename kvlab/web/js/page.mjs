// The page kvlab's HTTP server (kvlab/web/server.py) serves on localhost: it reads the job from /job, the
// model's files from /model/<name>, onnxruntime-web and transformers.js from /npm/..., runs the job and POSTs
// the result (or {error}) to /result; each finished step is POSTed to /progress as it happens.

import { runJob } from './runner.mjs';
import { loadTransformers } from './tjs.mjs';

const log = document.getElementById('log');
const say = (text) => {
  log.textContent += `\n${text}`;
};

function post(path, body) {
  return fetch(path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

// "Chromium 156.0.8078.114", "Google Chrome 140.0...", "Firefox 145.0", "Safari 26.0" (full version where the
// browser tells it)
export async function browserName() {
  const data = navigator.userAgentData;
  if (data) {
    let brands = data.brands;
    try {
      brands = (await data.getHighEntropyValues(['fullVersionList'])).fullVersionList ?? brands;
    } catch {
      // low-entropy brands only
    }
    const real = brands.filter((b) => !/^Not.A.Brand/i.test(b.brand));
    const brand = real.find((b) => b.brand !== 'Chromium') ?? real[0];
    if (brand) return `${brand.brand} ${brand.version}`;
  }
  const m = navigator.userAgent.match(/(Firefox|Edg|Chrome|Version)\/([\d.]+)/);
  return m ? `${m[1] === 'Version' ? 'Safari' : m[1]} ${m[2]}` : navigator.userAgent;
}

async function main() {
  const assets = await (await fetch('/assets')).json();
  const job = await (await fetch('/job')).json();
  const ortUrl = new URL(assets.ort, location.href).href;
  const ort = await import(ortUrl);
  ort.env.wasm.wasmPaths = { wasm: new URL(assets['ort-wasm'], location.href).href };
  say(`onnxruntime-web ${ort.env.versions.web}; model ${job.model.name}`);
  const bytes = {};
  const files = [...job.model.files, ...(job.model.transformers_graph ? [job.model.transformers_graph] : [])];
  for (const f of files) {
    bytes[f.name] = new Uint8Array(await (await fetch(`/model/${encodeURIComponent(f.name)}`)).arrayBuffer());
  }
  const transformers = async () => loadTransformers(ortUrl, await (await fetch(assets.transformers)).text());
  const host = {
    kind: 'browser',
    name: await browserName(),
    user_agent: navigator.userAgent,
    headless: /Headless/.test(navigator.userAgent),
  };
  return runJob({
    ort,
    gpu: navigator.gpu,
    job,
    bytes,
    host,
    transformers,
    onStep: (s) => {
      say(`step ${s.step}: ${s.wall_ms.toFixed(1)} ms`);
      post('/progress', s).catch(() => {});
    },
  });
}

main().then(
  (result) => {
    say('done');
    return post('/result', result);
  },
  (err) => {
    say(`error: ${err?.message ?? err}`);
    return post('/result', { error: `${err?.message ?? err}`, stack: `${err?.stack ?? ''}` });
  },
);
