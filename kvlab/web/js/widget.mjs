// The notebook widget's front end (anywidget): the runner in the attendee's own browser, fed over the Jupyter
// comm channel, so it works wherever the notebook does (a laptop, Binder, JupyterHub): no side server, no CDN.
//
// Contract (messages; kvlab/web/widget.py is the other side):
//   front end -> kernel  {type: 'start', have: [blob names it already holds]}   when Run is pressed
//   kernel -> front end  {type: 'blob', name, index, count} + one binary buffer  (npm assets, model files: chunks)
//   kernel -> front end  {type: 'job', job, assets: {ort, wasm, transformers}}  the job; its files were sent as blobs
//   front end -> kernel  {type: 'step', step} per finished step, then {type: 'result', result}
// On render the widget also reports this browser and its WebGPU adapter in the synced trait `browser`.
// Assets stay in this page (globalThis) for every later widget; onnxruntime-web is imported once per page.

import { browserHost, reportBrowser } from './host.mjs';
import { errorResult, jobFiles, runJob } from './runner.mjs';
import { loadTransformers } from './tjs.mjs';

const pageState = (globalThis.__kvlabWeb ??= { blobs: new Map(), ort: null, ortUrl: null });

function receiveBlob(msg, buffers) {
  let parts = pageState.blobs.get(msg.name);
  if (!parts || parts.done || parts.count !== msg.count) {
    parts = { chunks: new Array(msg.count), count: msg.count, received: 0, done: false };
    pageState.blobs.set(msg.name, parts);
  }
  const view = buffers[0];
  if (!parts.chunks[msg.index]) parts.received += 1;
  parts.chunks[msg.index] = new Uint8Array(view.buffer, view.byteOffset, view.byteLength).slice();
  if (parts.received === parts.count) {
    const total = parts.chunks.reduce((n, c) => n + c.byteLength, 0);
    const bytes = new Uint8Array(total);
    let offset = 0;
    for (const c of parts.chunks) {
      bytes.set(c, offset);
      offset += c.byteLength;
    }
    parts.bytes = bytes;
    parts.chunks = [];
    parts.done = true;
  }
}

function blob(name) {
  const b = pageState.blobs.get(name);
  if (!b?.done) throw new Error(`the kernel did not send ${name}`);
  return b.bytes;
}

async function loadOrt(assets) {
  if (!pageState.ort) {
    const text = new TextDecoder().decode(blob(assets.ort));
    pageState.ortUrl = URL.createObjectURL(new Blob([text], { type: 'text/javascript' }));
    pageState.ort = await import(pageState.ortUrl);
    const wasm = blob(assets.wasm);
    pageState.ort.env.wasm.wasmBinary = wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength);
    pageState.ort.env.wasm.wasmPaths = { wasm: URL.createObjectURL(new Blob([wasm], { type: 'application/wasm' })) };
  }
  return pageState.ort;
}

async function runHere(model, msg) {
  const { job, assets } = msg;
  const ort = await loadOrt(assets);
  const bytes = {};
  for (const f of jobFiles(job)) bytes[f.name] = blob(`model:${job.model.name}:${f.name}`);
  const transformers = assets.transformers
    ? async () => loadTransformers(pageState.ortUrl, new TextDecoder().decode(blob(assets.transformers)))
    : null;
  const onStep = (step) => model.send({ type: 'step', step });
  return runJob({ ort, gpu: navigator.gpu, job, bytes, host: await browserHost(), transformers, onStep });
}

function render({ model, el }) {
  el.classList.add('kvlab-browser-lab');
  const button = document.createElement('button');
  button.textContent = "Run it on this browser's GPU";
  const status = document.createElement('div');
  status.className = 'kvlab-browser-status';
  const summary = document.createElement('pre');
  summary.className = 'kvlab-browser-summary';
  const adapter = document.createElement('div');
  adapter.className = 'kvlab-browser-adapter';
  el.append(adapter, button, status, summary);

  const show = () => {
    status.textContent = model.get('status');
    summary.textContent = model.get('summary');
    const b = model.get('browser');
    const a = b?.adapter;
    adapter.textContent = a
      ? `this browser: ${b.name}; WebGPU adapter: ${[a.vendor, a.architecture].filter(Boolean).join(' ') || a.description}${a.is_fallback ? ' (software)' : ''}`
      : b?.name
        ? `this browser: ${b.name}; ${b.webgpu ? b.error ?? 'WebGPU adapter: ...' : 'no WebGPU (navigator.gpu is missing)'}`
        : '';
    button.disabled = model.get('running');
  };
  model.on('change:status', show);
  model.on('change:summary', show);
  model.on('change:browser', show);
  model.on('change:running', show);
  show();

  reportBrowser(model);

  let mine = false; // only the view whose button was pressed runs the job (a widget may be shown twice)
  const onMessage = (msg, buffers) => {
    if (msg.type === 'blob') receiveBlob(msg, buffers);
    if (msg.type === 'job' && mine) {
      mine = false;
      runHere(model, msg).then(
        (result) => model.send({ type: 'result', result }),
        (err) => model.send({ type: 'result', result: errorResult(err) }),
      );
    }
  };
  model.on('msg:custom', onMessage);
  button.addEventListener('click', () => {
    mine = true;
    const have = [...pageState.blobs.entries()].filter(([, b]) => b.done).map(([name]) => name);
    model.send({ type: 'start', have });
  });
  return () => model.off('msg:custom', onMessage);
}

export default { render };
